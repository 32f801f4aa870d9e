package dedupe

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/dedupe/internal/sqldb"
)

// SQL wraps a database/sql handle to PostgreSQL (over pgx's stdlib, lib/pq or
// any driver that speaks PostgreSQL's SQL) as the DB of an Inbox or an outbox.Outbox,
// for applications built on database/sql (GORM, Bun, sqlx, sqlc): handlers
// then receive a *sql.Tx (see TxHandlerFunc), and the guarantees are the
// same as with pgx.
//
// What database/sql cannot do costs round trips, never correctness. BEGIN
// goes alone. Over pgx's stdlib the claim and the savepoint follow in one
// round trip, through the *pgx.Conn under the transaction; over other
// drivers (lib/pq, or pgx's stdlib wrapped by another driver) one after the
// other, each only when needed. Over pgx's stdlib the read of an existing key
// is placed as over pgx: with the claim while the inbox's recent claims met
// duplicates, else only after a claim that found its key taken; over other
// drivers it follows only such a claim. The outbox.Relay cannot LISTEN, so it polls
// (outbox.RelayConfig.PollInterval). A handler's *sql.Tx cannot be guarded, but
// its COMMIT proves that it still holds the claim: a handler that commits
// or rolls back itself (and perhaps begins again) gets ErrTxEnded from
// Handle, nothing is reported processed, its key is marked failed as over
// pgx, and its effects commit at most once (Handle says how). Over pgx's
// stdlib the proof costs no round trip; over other drivers one.
func SQL(db *sql.DB) *SQLDB {
	return &SQLDB{sqlQuerier: sqlQuerier{db}, db: db, drv: sqldb.NewDriver(db, sqlCommitClaim, sqlCheckClaim, errTxIdle)}
}

// SQLTx wraps a database/sql transaction for the calls that join the
// caller's transaction: Inbox.Claim, ClaimBatch, StoreResultTx, CompleteTx
// and outbox.Outbox.Enqueue.
func SQLTx(tx *sql.Tx) Querier { return sqlQuerier{tx} }

// SQLDB is a database/sql handle as a DB: the database/sql driver
// (internal/sqldb's Driver). Build it with SQL.
type SQLDB struct {
	sqlQuerier
	db  *sql.DB
	drv *sqldb.Driver
}

// DB returns the wrapped handle, for packages built on the inbox that run
// transactions of their own (httpidem).
func (d *SQLDB) DB() *sql.DB { return d.db }

// sqlQuerier runs the core's statements through database/sql, with the
// conversions of internal/sqldb.
type sqlQuerier struct{ r sqldb.Runner }

// Exec runs a statement.
func (q sqlQuerier) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	return sqldb.Querier{R: q.r}.Exec(ctx, query, args...)
}

// Query runs a query; its rows read intervals as durations.
func (q sqlQuerier) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	return sqldb.Querier{R: q.r}.Query(ctx, query, args...)
}

// QueryRow runs a query for one row; no row is pgx.ErrNoRows (and
// sql.ErrNoRows).
func (q sqlQuerier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return sqldb.Querier{R: q.r}.QueryRow(ctx, query, args...)
}
