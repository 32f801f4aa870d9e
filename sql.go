package dedupe

import "strings"

// All SQL of the core's inbox lives here. {{inbox}} is replaced by the
// quoted, optionally schema-qualified inbox table when an Inbox is built, and
// {{now}} by the database's time: coalesce($1, clock_timestamp()).
//
// Time comes from the database. Every statement takes $1, the test clock
// (Config.Clock, NULL unless a test set it), and otherwise reads
// clock_timestamp() where it decides: the moment the statement runs, after
// any wait for a pool connection or a lock, never a reading the application
// took before. (now() would be the transaction's start, which may be long
// past.) Durations travel as intervals.

// nowSQL is the database's time, or the test clock when $1 is not NULL.
const nowSQL = `coalesce($1::timestamptz, clock_timestamp())`

// recordColumns is the column list scanned by scanRecord; its last column
// is the time the row was read.
const recordColumns = `scope, key, state, fingerprint, attempts, token, locked_until,
    result_status, result_headers, result_body, last_error, created_at, updated_at, expires_at, {{now}}`

// claimValues are the VALUES of a claim's insert. $2 scope, $3 key, $4 state
// to set, $5 fingerprint, $6 token, $7 lease (interval; the new row's
// locked_until is now + lease for an in-flight claim, NULL for a complete
// one), $8 retention.
const claimValues = `VALUES ($2::text, $3::text, $4::text, $5::bytea, 1, $6::bigint,
    CASE WHEN $4::text = 'in_flight' THEN {{now}} + $7::interval END,
    {{now}}, {{now}}, {{now}} + $8::interval)`

// claimReturning is what a claim returns: the attempt, the lease's end and
// how much of it is left when the statement ends (measured then, so a lock
// wait inside the statement is not counted as lease).
const claimReturning = `RETURNING t.state, t.attempts, t.locked_until, t.locked_until - {{now}}`

// sqlClaimInsert is the claim's first and usually only statement: it inserts
// a new key, or returns no row when the key exists, without locking it. It
// costs what a hand-written INSERT … ON CONFLICT DO NOTHING costs. The
// consumer sends it in one round trip with BEGIN, sqlLookup and a savepoint,
// so that a duplicate learns the existing row's state without a second
// round trip.
const sqlClaimInsert = `INSERT INTO {{inbox}} AS t
    (scope, key, state, fingerprint, attempts, token, locked_until, created_at, updated_at, expires_at)
` + claimValues + `
ON CONFLICT (scope, key) DO NOTHING
` + claimReturning

// sqlTakeover is the conflict clause of sqlClaim and sqlClaimBatch: an
// in-flight key whose lease expired, with agreeing fingerprints, is taken
// over (attempts + 1, a new token), or marked failed when its attempts ($9,
// 0 = no limit) are used up. Any other existing row is left alone. The
// condition is checked on the locked row at the time the lock is granted.
const sqlTakeover = `ON CONFLICT (scope, key) DO UPDATE SET
    state        = CASE WHEN $9::int > 0 AND t.attempts >= $9::int THEN 'failed' ELSE EXCLUDED.state END,
    attempts     = CASE WHEN $9::int > 0 AND t.attempts >= $9::int THEN t.attempts ELSE t.attempts + 1 END,
    token        = CASE WHEN $9::int > 0 AND t.attempts >= $9::int THEN t.token ELSE EXCLUDED.token END,
    locked_until = CASE WHEN ($9::int > 0 AND t.attempts >= $9::int) OR EXCLUDED.state <> 'in_flight' THEN NULL
                        ELSE {{now}} + $7::interval END,
    fingerprint  = COALESCE(t.fingerprint, EXCLUDED.fingerprint),
    updated_at   = {{now}},
    expires_at   = {{now}} + $8::interval
WHERE t.state = 'in_flight'
  AND t.locked_until <= {{now}}
  AND (t.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL OR t.fingerprint = EXCLUDED.fingerprint)`

// sqlClaim takes over an existing key that is in flight with an expired
// lease (its holder died, or a transactional attempt failed and released
// it) when the fingerprints agree; when the attempts are used up it marks the
// key failed instead. Any other row is left alone and no row is returned.
// The upsert makes the takeover atomic: concurrent takeovers queue on the row
// lock and re-check the condition against the winner's version.
//
// Parameters: those of claimValues, and $9 max attempts (0 = no limit).
const sqlClaim = `INSERT INTO {{inbox}} AS t
    (scope, key, state, fingerprint, attempts, token, locked_until, created_at, updated_at, expires_at)
` + claimValues + `
` + sqlTakeover + `
` + claimReturning

// claimBatchColumns are the columns a batch claim inserts.
const claimBatchColumns = `INSERT INTO {{inbox}} AS t
    (scope, key, state, fingerprint, attempts, token, locked_until, created_at, updated_at, expires_at)
`

// claimBatchValues are the values of a batch claim's rows after scope and
// key: $4 state, u.fingerprint, $6 token, $7 lease, $8 retention.
const claimBatchValues = `$4::text, u.fingerprint, 1, $6::bigint,
    CASE WHEN $4::text = 'in_flight' THEN n.now + $7::interval END, n.now, n.now, n.now + $8::interval`

// claimBatchNow is the time a batch claim writes into every new row, read
// once per statement (a volatile clock in the select list is read once per
// row and per use): the batch's keys share their expiry, which the expiry
// index stores once per value (B-tree deduplication), as a hand-written
// batch insert with one timestamp parameter does.
const claimBatchNow = `CROSS JOIN (SELECT {{now}} AS now) n`

// claimBatchReturning identifies a row the batch claim took (its key, and
// its scope in the general form) and says whether it was taken (attempt
// counted) or marked failed (attempts used up), without any per-row value
// the client would have to allocate beyond the key's bytes.
const claimBatchReturning = `RETURNING t.key, t.attempts, t.state = 'failed'`

// sqlClaimBatch is sqlClaim over arrays: $2 scopes, $3 keys, $5
// fingerprints; $4 state, $6 the batch's token (one per batch: a token
// fences one key's claim, and the keys of a batch are distinct), $7 lease,
// $8 retention, $9 max attempts. The arrays must hold distinct (scope, key) pairs, sorted, so that
// concurrent batches lock rows in the same order (ORDER BY the arrays'
// order). A NULL $5 means no fingerprints (unnest pads it with NULLs).
const sqlClaimBatch = claimBatchColumns + `SELECT u.scope, u.key, ` + claimBatchValues + `
FROM unnest($2::text[], $3::text[], $5::bytea[]) WITH ORDINALITY AS u(scope, key, fingerprint, ord)
` + claimBatchNow + `
ORDER BY u.ord
` + sqlTakeover + `
` + claimBatchReturning + `, t.scope`

// sqlClaimBatchScope is sqlClaimBatch for keys of one scope, the common
// case: $2 is that scope, a scalar, so the statement carries one array
// fewer and returns no scope. Its other parameters are sqlClaimBatch's.
const sqlClaimBatchScope = claimBatchColumns + `SELECT $2::text, u.key, ` + claimBatchValues + `
FROM unnest($3::text[], $5::bytea[]) WITH ORDINALITY AS u(key, fingerprint, ord)
` + claimBatchNow + `
ORDER BY u.ord
` + sqlTakeover + `
` + claimBatchReturning

// sqlLookup reads one row. $2 scope, $3 key.
const sqlLookup = `SELECT ` + recordColumns + ` FROM {{inbox}} WHERE scope = $2 AND key = $3`

// sqlLookupOther is sqlLookup that skips the row of the claim queued before
// it ($4, its token): a transactional claim with a new token reads another
// transaction's row or none, never its own insert again. $2 scope, $3 key.
const sqlLookupOther = sqlLookup + ` AND token <> $4`

// sqlPeek is the read the consumer queues behind its claim insert: only
// what classifies an existing key (no stored result, which Handle does not
// return), and no row at all for the key this claim just inserted (its own
// token, $4), so a new key pays for an index probe and nothing more. $2
// scope, $3 key, $4 the claim's token.
const sqlPeek = `SELECT state, attempts, token, locked_until, fingerprint, {{now}}
FROM {{inbox}} WHERE scope = $2 AND key = $3 AND token <> $4`

// sqlLookupBatch reads the rows of several keys. $2 scopes, $3 keys.
const sqlLookupBatch = `SELECT ` + recordColumns + ` FROM {{inbox}}
WHERE (scope, key) IN (SELECT * FROM unnest($2::text[], $3::text[]))`

// failSet ends a failed attempt: the key is released for the next attempt
// (in flight with a lease that ends now) or, when the attempts are used up or
// the error is permanent, marked failed; a failed key stays failed. $5 max attempts, $6 permanent, $7
// error text, $8 retention.
const failSet = `
    state        = CASE WHEN t.state = 'failed' OR $6::bool OR ($5::int > 0 AND t.attempts >= $5::int)
                        THEN 'failed' ELSE 'in_flight' END,
    locked_until = CASE WHEN t.state = 'failed' OR $6::bool OR ($5::int > 0 AND t.attempts >= $5::int)
                        THEN NULL ELSE {{now}} END,
    last_error   = $7,
    updated_at   = {{now}},
    expires_at   = {{now}} + $8::interval`

// sqlFail ends a failed leased attempt, fenced by its token ($2 scope, $3
// key, $4 token, then failSet's). It is idempotent: failing the same claim
// again (a retry after a lost reply) finds its own token and changes
// nothing that matters. Attempts were counted when they were claimed.
const sqlFail = `UPDATE {{inbox}} AS t SET` + failSet + `
WHERE scope = $2 AND key = $3 AND token = $4 AND state <> 'complete'
RETURNING t.state, t.attempts`

// sqlFailTx ends a failed transactional attempt inside its own transaction,
// after the handler's effects were rolled back to the savepoint taken right
// after the claim: the claim row (state complete, not yet committed) becomes
// the failure record, and the commit that follows releases the key with the
// attempt counted. Concurrent duplicates wait on the uncommitted claim, so
// none can start an attempt that this one has not counted: the attempt limit
// holds exactly. Parameters as sqlFail.
const sqlFailTx = `UPDATE {{inbox}} AS t SET` + failSet + `
WHERE scope = $2 AND key = $3 AND token = $4
RETURNING t.state, t.attempts`

// sqlRecordFailure counts a failed transactional attempt after its
// transaction rolled back (the claim went with it), for attempts that ended
// without the savepoint path: a handler that ended the transaction itself.
// It never touches a complete key or a key in a live lease. $2 scope, $3
// key, $4 fingerprint, $5 max attempts, $6 permanent, $7 error text, $8
// retention.
const sqlRecordFailure = `INSERT INTO {{inbox}} AS t
    (scope, key, state, fingerprint, attempts, token, locked_until, last_error, created_at, updated_at, expires_at)
VALUES ($2::text, $3::text,
    CASE WHEN $6::bool OR ($5::int > 0 AND 1 >= $5::int) THEN 'failed' ELSE 'in_flight' END,
    $4::bytea, 1, 0,
    CASE WHEN $6::bool OR ($5::int > 0 AND 1 >= $5::int) THEN NULL ELSE {{now}} END,
    $7::text, {{now}}, {{now}}, {{now}} + $8::interval)
ON CONFLICT (scope, key) DO UPDATE SET
    attempts     = t.attempts + 1,
    state        = CASE WHEN $6::bool OR ($5::int > 0 AND t.attempts + 1 >= $5::int) THEN 'failed' ELSE 'in_flight' END,
    locked_until = CASE WHEN $6::bool OR ($5::int > 0 AND t.attempts + 1 >= $5::int) THEN NULL ELSE {{now}} END,
    last_error   = EXCLUDED.last_error,
    updated_at   = {{now}},
    expires_at   = {{now}} + $8::interval
WHERE t.state = 'in_flight' AND (t.locked_until IS NULL OR t.locked_until <= {{now}})
RETURNING t.state, t.attempts`

// sqlStoreResult writes a transactional claim's result inside its own
// transaction, fenced by its token. It decides nothing by time, so it takes
// no clock: $1 scope, $2 key, $3 status, $4 headers, $5 body, $6 token.
const sqlStoreResult = `UPDATE {{inbox}} SET result_status = $3, result_headers = $4, result_body = $5
WHERE scope = $1 AND key = $2 AND token = $6`

// sqlStoreResultOrFail is sqlStoreResult for a caller that sends its COMMIT
// in the same round trip (Inbox.QueueStoreResult): when no row matches (the
// claim is not this transaction's) the statement fails with
// division_by_zero, which aborts the transaction, so that the COMMIT queued
// after it cannot commit the effects without the result. PostgreSQL has no
// RAISE outside PL/pgSQL; 1 / count(*) is the assertion. Same parameters.
const sqlStoreResultOrFail = `WITH stored AS (
    UPDATE {{inbox}} SET result_status = $3, result_headers = $4, result_body = $5
    WHERE scope = $1 AND key = $2 AND token = $6
    RETURNING 1
)
SELECT 1 / count(*) FROM stored`

// sqlComplete finishes a leased claim, fenced by its token. When it changes
// no row, the caller reads the key: complete under the same token means a
// retry of a Complete whose reply was lost, which succeeds without
// rewriting the stored result. $2 scope, $3 key, $4 token, $5 status, $6
// headers, $7 body, $8 retention.
const sqlComplete = `UPDATE {{inbox}} SET state = 'complete', locked_until = NULL,
    result_status = $5, result_headers = $6, result_body = $7, last_error = NULL,
    updated_at = {{now}}, expires_at = {{now}} + $8::interval
WHERE scope = $2 AND key = $3 AND token = $4 AND state = 'in_flight'`

// sqlExtend renews a lease to now + $5, fenced by its token, and returns
// the new end and how much of it is left when the statement ends. $2 scope,
// $3 key, $4 token, $5 lease (interval).
const sqlExtend = `UPDATE {{inbox}} SET locked_until = {{now}} + $5::interval, updated_at = {{now}}
WHERE scope = $2 AND key = $3 AND token = $4 AND state = 'in_flight'
RETURNING locked_until, locked_until - {{now}}`

// sqlRelease deletes a key so that it can be claimed afresh. It takes no
// clock: $1 scope, $2 key.
const sqlRelease = `DELETE FROM {{inbox}} WHERE scope = $1 AND key = $2`

// sqlReleaseToken deletes a claim that committed without its effects: a
// batch handler that committed the batch's transaction behind dedupe's back
// also committed the claims of the messages whose handler had not run yet.
// It takes no clock: $1 scope, $2 key, $3 token.
const sqlReleaseToken = `DELETE FROM {{inbox}} WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'complete'`

// sqlUnclaimNew and sqlUnclaimTaken give back, inside the transaction that
// made them, claims of a batch that will not commit their effects: a new
// key's row is deleted, a key taken over is released again as it was (in
// flight, lease ended, the attempt not counted). $2 scopes, $3 keys, $4
// tokens.
const (
	sqlUnclaimNew = `DELETE FROM {{inbox}} AS t USING unnest($2::text[], $3::text[], $4::bigint[]) AS u(scope, key, token)
WHERE t.scope = u.scope AND t.key = u.key AND t.token = u.token AND t.attempts = 1 AND $1::timestamptz IS NOT DISTINCT FROM $1`
	sqlUnclaimTaken = `UPDATE {{inbox}} AS t SET state = 'in_flight', attempts = t.attempts - 1, locked_until = {{now}}, updated_at = {{now}}
FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(scope, key, token)
WHERE t.scope = u.scope AND t.key = u.key AND t.token = u.token AND t.attempts > 1`
)

// sqlReleaseIdle is sqlRelease that leaves a key in a live lease alone, in
// the same statement. $2 scope, $3 key.
const sqlReleaseIdle = `DELETE FROM {{inbox}} WHERE scope = $2 AND key = $3
  AND NOT (state = 'in_flight' AND locked_until > {{now}})`

// sqlPurge deletes one bounded batch of keys expired for longer than $2
// (interval), never one in a live lease. It walks the expires_at index and
// skips rows locked by others, so it neither scans the table nor waits on
// consumers. $3 limit.
const sqlPurge = `DELETE FROM {{inbox}} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{inbox}}
    WHERE expires_at <= {{now}} - $2::interval
      AND (state <> 'in_flight' OR locked_until IS NULL OR locked_until <= {{now}})
    ORDER BY expires_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED))`

// sqlStats counts keys by scope and state, with the live leases measured on
// the database's clock.
const sqlStats = `SELECT scope, state, count(*),
    min(created_at) FILTER (WHERE state = 'in_flight'),
    {{now}} - min(created_at) FILTER (WHERE state = 'in_flight'),
    count(*) FILTER (WHERE state = 'in_flight' AND locked_until > {{now}})
FROM {{inbox}} GROUP BY scope, state ORDER BY scope, state`

// sqlResolve learns whether a transaction whose COMMIT reply was lost
// committed its claim. It tries to insert the key: the insert waits for any
// transaction still holding the key (the lost one, if its COMMIT has not
// been processed yet) and then either inserts a probe row (nothing was
// committed) or locks and returns the committed row, whose token says whose
// it is. The caller always rolls back. $2 scope, $3 key, $4 probe token.
const sqlResolve = `INSERT INTO {{inbox}} AS t
    (scope, key, state, attempts, token, created_at, updated_at, expires_at)
VALUES ($2::text, $3::text, 'in_flight', 0, $4::bigint, {{now}}, {{now}}, {{now}})
ON CONFLICT (scope, key) DO UPDATE SET token = t.token
RETURNING t.token, t.state`

// sqlSavepoint is taken right after a transactional claim, so that a failed
// handler's effects roll back while the claim stays held (sqlFailTx).
const (
	sqlSavepointName = `dedupe_claim`
	sqlSavepoint     = `SAVEPOINT ` + sqlSavepointName
)

// sqlReplication reads what decides whether a commit survives a failover:
// the standbys streaming, synchronous_standby_names and synchronous_commit.
const sqlReplication = `SELECT (SELECT count(*) FROM pg_stat_replication),
    current_setting('synchronous_standby_names'), current_setting('synchronous_commit')`

// sqlTxSettings sets a consumer's settings for its claim's transaction
// only, as SET LOCAL does: $1 is a JSON object of settings and their values
// (txopts.Settings: lock_timeout, synchronous_commit), sent with BEGIN.
const sqlTxSettings = `SELECT set_config(s.name, s.value, true) FROM json_each_text($1::text::json) AS s(name, value)`

// sqlCommitClaim commits a Consumer's transaction only if it is still the
// one that holds the claim: the savepoint taken right after the claim must
// be there to be released. A handler that ended the transaction itself (a
// ROLLBACK or COMMIT sent as a statement, then perhaps BEGIN) left no
// savepoint of that name: the RELEASE fails, with no transaction open
// (25P01) or in the new one (3B001), and the COMMIT behind it, in the same
// simple query, does not run. One message, one round trip: what COMMIT alone
// costs.
const sqlCommitClaim = `RELEASE SAVEPOINT ` + sqlSavepointName + `; COMMIT`

// sqlCheckClaim is the check of sqlCommitClaim on its own, for a driver
// whose COMMIT dedupe cannot send itself: sent before it.
const sqlCheckClaim = `RELEASE SAVEPOINT ` + sqlSavepointName

// queries holds the SQL of one Inbox with its table name filled in.
type queries struct {
	claimInsert, claim, claimBatch, claimBatchScope, lookup, lookupBatch, recordFailure, storeResult string
	storeResultOrFail                                                                                string
	complete, fail, failTx, extend, release, releaseIdle, purge, stats, resolve                      string
	releaseToken, unclaimNew, unclaimTaken, peek, lookupOther                                        string
}

func newQueries(table string) queries {
	r := strings.NewReplacer("{{inbox}}", table, "{{now}}", nowSQL)
	return queries{
		claimInsert:       r.Replace(sqlClaimInsert),
		claim:             r.Replace(sqlClaim),
		claimBatch:        r.Replace(sqlClaimBatch),
		claimBatchScope:   r.Replace(sqlClaimBatchScope),
		lookup:            r.Replace(sqlLookup),
		lookupBatch:       r.Replace(sqlLookupBatch),
		recordFailure:     r.Replace(sqlRecordFailure),
		storeResult:       r.Replace(sqlStoreResult),
		storeResultOrFail: r.Replace(sqlStoreResultOrFail),
		complete:          r.Replace(sqlComplete),
		fail:              r.Replace(sqlFail),
		failTx:            r.Replace(sqlFailTx),
		extend:            r.Replace(sqlExtend),
		release:           r.Replace(sqlRelease),
		releaseIdle:       r.Replace(sqlReleaseIdle),
		purge:             r.Replace(sqlPurge),
		stats:             r.Replace(sqlStats),
		resolve:           r.Replace(sqlResolve),
		releaseToken:      r.Replace(sqlReleaseToken),
		unclaimNew:        r.Replace(sqlUnclaimNew),
		unclaimTaken:      r.Replace(sqlUnclaimTaken),
		peek:              r.Replace(sqlPeek),
		lookupOther:       r.Replace(sqlLookupOther),
	}
}
