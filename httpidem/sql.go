package httpidem

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// All SQL of the package: the statements that frame a transactional claim
// and the guarded update of Versioned. The key table itself is the core
// inbox (dedupe's SQL).

// The statements sent with a transactional claim, in the same round trip:
// the lock timeout is set for the claim alone (a concurrent request holding
// the key makes the claim fail fast with lock_not_available), the previous
// value is kept in a placeholder setting and restored after the claim, so
// the handler's own lock waits are not bounded by it; the savepoint after
// the claim lets a failed handler's effects roll back while the claim stays
// held. Every setting is LOCAL: it ends with the transaction.
const (
	// sqlSetLockTimeout keeps the transaction's lock_timeout and sets it
	// for the claim to $1 (e.g. '100ms'), in one statement: the inner
	// set_config, which keeps the old value, is an argument of the outer
	// one (concatenated as ''), so it runs first.
	sqlSetLockTimeout = `SELECT set_config('lock_timeout',
    $1::text || left(set_config('httpidem.lock_timeout', current_setting('lock_timeout'), true), 0), true)`
	// sqlRestoreLockTimeout restores the kept value.
	sqlRestoreLockTimeout = `SELECT set_config('lock_timeout', current_setting('httpidem.lock_timeout'), true)`
	// sqlClaimSavepoint is taken right after the claim (transactional mode)
	// or BEGIN (the handler's transaction in leased mode): only the
	// transaction that took it holds it, so that releasing it before the
	// commit (sqlCheckClaim, or dedupe.CheckedTxOptions' COMMIT) proves the
	// transaction is still the request's, not one the handler ended
	// (a ROLLBACK sent as a statement) and perhaps began again.
	sqlClaimSavepoint = `SAVEPOINT ` + dedupe.ClaimSavepoint
	sqlCheckClaim     = `RELEASE SAVEPOINT ` + dedupe.ClaimSavepoint
	// sqlRollbackSavepoint rolls the handler's effects back to the claim's
	// savepoint (StoreServerErrors: the claim stays held, and so does the
	// savepoint, for the check that follows).
	sqlRollbackSavepoint = `ROLLBACK TO SAVEPOINT ` + dedupe.ClaimSavepoint
)

// versionedSQL renders the statements of a Versioned for its table and
// columns. set is the caller's SET list using $1..$nArgs; the key columns
// follow as $nArgs+1.., then the acceptable versions and the wildcard flag.
//
//	UPDATE t SET <set>, version = version + 1
//	WHERE k1 = $n+1 AND … AND (version = ANY($n+k+1::bigint[]) OR $n+k+2::bool)
//	RETURNING version
func versionedUpdateSQL(table string, keys []string, version, set string, nArgs int) string {
	v := pgx.Identifier{version}.Sanitize()
	var b strings.Builder
	fmt.Fprintf(&b, "UPDATE %s SET %s, %s = %s + 1 WHERE ", table, set, v, v)
	for i, k := range keys {
		fmt.Fprintf(&b, "%s = $%d AND ", pgx.Identifier{k}.Sanitize(), nArgs+i+1)
	}
	n := nArgs + len(keys)
	fmt.Fprintf(&b, "(%s = ANY($%d::bigint[]) OR $%d::bool) RETURNING %s", v, n+1, n+2, v)
	return b.String()
}

// versionedCurrentSQL reads the current version of one row: $1.. the keys.
func versionedCurrentSQL(table string, keys []string, version string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT %s FROM %s WHERE ", pgx.Identifier{version}.Sanitize(), table)
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" AND ")
		}
		fmt.Fprintf(&b, "%s = $%d", pgx.Identifier{k}.Sanitize(), i+1)
	}
	return b.String()
}
