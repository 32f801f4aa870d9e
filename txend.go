package dedupe

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
)

// A transaction whose end belongs to dedupe (a Consumer's, httpidem's) can be
// ended by the code it is handed: a ROLLBACK or COMMIT sent as a statement,
// then perhaps BEGIN and more writes. Its COMMIT must then not report the
// work processed. The proof is the savepoint ClaimSavepoint, taken right
// after the claim (or BEGIN): only the transaction that took it holds it,
// and the COMMIT releases it first, in the same simple query (one round trip,
// as COMMIT alone), so that a transaction ended and begun again fails there
// and commits nothing. Consumer does this on its own; the functions below
// are for packages that own a transaction themselves (httpidem).

// ClaimSavepoint is the savepoint a checked COMMIT releases: take it with
// SAVEPOINT dedupe_claim right after the claim (or BEGIN), in the same round
// trip where the driver can.
const ClaimSavepoint = sqlSavepointName

// CheckedTxOptions returns opts with the checked COMMIT as pgx's
// CommitQuery: a pgx.Tx begun with them commits only while it still holds
// ClaimSavepoint. Pass its Commit's error through CommitError.
func CheckedTxOptions(opts pgx.TxOptions) pgx.TxOptions {
	opts.CommitQuery = sqlCommitClaim
	return opts
}

// CommitError maps the error of a checked COMMIT (CheckedTxOptions): a
// transaction that no longer held ClaimSavepoint (ended behind its owner's
// back, perhaps begun again) matches ErrTxEnded; nothing committed. Other
// errors are mapped as the package maps every driver error.
func CommitError(err error) error { return translate(err) }

// CommitSQLTx commits tx, a database/sql transaction that took
// ClaimSavepoint, only while it still holds it: a transaction ended behind
// its owner's back returns an error matching ErrTxEnded, is rolled back, and
// nothing of it commits. The check goes before the driver's COMMIT, one
// round trip more than tx.Commit (a Consumer's *sql.Tx over pgx's stdlib
// pays none: it holds the connection under the transaction). A transaction
// a failed statement aborted returns the driver's failed-commit error as
// tx.Commit does.
func CommitSQLTx(ctx context.Context, tx *sql.Tx) error {
	t := &sqlTx{sqlQuerier: sqlQuerier{tx}, tx: tx}
	return translate(t.commitClaim(ctx))
}
