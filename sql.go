package dedupe

import "strings"

// All SQL of the core lives here. {{inbox}} is replaced by the quoted,
// optionally schema-qualified inbox table when an Inbox is built.

// recordColumns is the column list scanned by scanRecord.
const recordColumns = `scope, key, state, fingerprint, attempts, token, locked_until,
    result_status, result_headers, result_body, last_error, created_at, updated_at, expires_at`

// sqlClaimInsert is the claim's first and usually only statement: it
// inserts a new key and returns its attempt (1), or returns no row when the
// key exists, without locking it. It costs what a hand-written
// INSERT … ON CONFLICT DO NOTHING costs. Only then does the caller read the
// existing row (sqlLookup) to classify it, and take it over (sqlClaim) when it
// is in flight with an expired lease.
//
// Parameters: $1 scope, $2 key, $3 state to set, $4 fingerprint, $5 token,
// $6 locked_until, $7 now, $8 expires_at.
const sqlClaimInsert = `INSERT INTO {{inbox}}
    (scope, key, state, fingerprint, attempts, token, locked_until, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $7, $8)
ON CONFLICT (scope, key) DO NOTHING
RETURNING attempts`

// sqlTakeover is the conflict clause of sqlClaim and sqlClaimBatch: an
// in-flight key whose lease expired, with agreeing fingerprints, is taken
// over (attempts + 1, a new token), or marked failed when its attempts ($9,
// 0 = no limit) are used up. Any other existing row is left alone.
const sqlTakeover = `ON CONFLICT (scope, key) DO UPDATE SET
    state        = CASE WHEN $9::int > 0 AND t.attempts >= $9::int THEN 'failed' ELSE EXCLUDED.state END,
    attempts     = CASE WHEN $9::int > 0 AND t.attempts >= $9::int THEN t.attempts ELSE t.attempts + 1 END,
    token        = CASE WHEN $9::int > 0 AND t.attempts >= $9::int THEN t.token ELSE EXCLUDED.token END,
    locked_until = CASE WHEN $9::int > 0 AND t.attempts >= $9::int THEN NULL ELSE EXCLUDED.locked_until END,
    fingerprint  = COALESCE(t.fingerprint, EXCLUDED.fingerprint),
    updated_at   = EXCLUDED.updated_at,
    expires_at   = EXCLUDED.expires_at
WHERE t.state = 'in_flight'
  AND t.locked_until <= EXCLUDED.updated_at
  AND (t.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL OR t.fingerprint = EXCLUDED.fingerprint)`

// sqlClaim takes over an existing key that is in flight with an expired
// lease (its holder died or a transactional attempt failed) when the
// fingerprints agree; when the attempts are used up it marks the key failed
// instead. Any other row is left alone and no row is returned. The upsert
// form makes the takeover atomic: concurrent takeovers queue on the row lock
// and re-check the condition against the winner's version.
//
// Parameters: $1 scope, $2 key, $3 state to set, $4 fingerprint, $5 token,
// $6 locked_until, $7 now, $8 expires_at, $9 max attempts (0 = no limit).
const sqlClaim = `INSERT INTO {{inbox}} AS t
    (scope, key, state, fingerprint, attempts, token, locked_until, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $7, $8)
` + sqlTakeover + `
RETURNING t.state, t.attempts`

// sqlClaimBatch is sqlClaim over arrays: $1 scopes, $2 keys, $3 fingerprints,
// $4 tokens; $5 state, $6 locked_until, $7 now, $8 expires_at, $9 max
// attempts. The arrays must hold distinct (scope, key) pairs, sorted, so that
// concurrent batches lock rows in the same order.
const sqlClaimBatch = `INSERT INTO {{inbox}} AS t
    (scope, key, state, fingerprint, attempts, token, locked_until, created_at, updated_at, expires_at)
SELECT u.scope, u.key, $5, u.fingerprint, 1, u.token, $6, $7, $7, $8
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[]) WITH ORDINALITY AS u(scope, key, fingerprint, token, ord)
ORDER BY u.ord
` + sqlTakeover + `
RETURNING t.scope, t.key, t.state, t.attempts`

// sqlLookup reads one row. $1 scope, $2 key.
const sqlLookup = `SELECT ` + recordColumns + ` FROM {{inbox}} WHERE scope = $1 AND key = $2`

// sqlLookupBatch reads the rows of several keys. $1 scopes, $2 keys.
const sqlLookupBatch = `SELECT ` + recordColumns + ` FROM {{inbox}}
WHERE (scope, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))`

// sqlRecordFailure counts a failed transactional attempt after its
// transaction rolled back, and marks the key failed when the attempts are
// used up or the error is permanent. It never touches a complete key or a key
// in a live lease. $1 scope, $2 key, $3 fingerprint, $4 now, $5 expires_at,
// $6 max attempts, $7 permanent, $8 error text.
const sqlRecordFailure = `INSERT INTO {{inbox}} AS t
    (scope, key, state, fingerprint, attempts, token, locked_until, last_error, created_at, updated_at, expires_at)
VALUES ($1, $2,
    CASE WHEN $7::bool OR ($6::int > 0 AND 1 >= $6::int) THEN 'failed' ELSE 'in_flight' END,
    $3, 1, 0,
    CASE WHEN $7::bool OR ($6::int > 0 AND 1 >= $6::int) THEN NULL ELSE $4::timestamptz END,
    $8, $4, $4, $5)
ON CONFLICT (scope, key) DO UPDATE SET
    attempts     = t.attempts + 1,
    state        = CASE WHEN $7::bool OR ($6::int > 0 AND t.attempts + 1 >= $6::int) THEN 'failed' ELSE 'in_flight' END,
    locked_until = CASE WHEN $7::bool OR ($6::int > 0 AND t.attempts + 1 >= $6::int) THEN NULL ELSE $4::timestamptz END,
    last_error   = EXCLUDED.last_error,
    updated_at   = EXCLUDED.updated_at,
    expires_at   = EXCLUDED.expires_at
WHERE t.state = 'in_flight' AND (t.locked_until IS NULL OR t.locked_until <= $4::timestamptz)
RETURNING t.state, t.attempts`

// sqlStoreResult writes a transactional claim's result inside its own
// transaction, fenced by its token. $1 scope, $2 key, $3 status, $4 headers,
// $5 body, $6 token.
const sqlStoreResult = `UPDATE {{inbox}} SET result_status = $3, result_headers = $4, result_body = $5
WHERE scope = $1 AND key = $2 AND token = $6`

// sqlComplete finishes a leased claim, fenced by its token. $1 scope, $2 key,
// $3 token, $4 status, $5 headers, $6 body, $7 now, $8 expires_at.
const sqlComplete = `UPDATE {{inbox}} SET state = 'complete', locked_until = NULL,
    result_status = $4, result_headers = $5, result_body = $6, last_error = NULL,
    updated_at = $7, expires_at = $8
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'`

// sqlFail releases a leased claim after a failed attempt, fenced by its
// token, so that a retry can take it over at once; when the attempts are used
// up or the error is permanent the key is marked failed. $1 scope, $2 key,
// $3 token, $4 now, $5 max attempts, $6 permanent, $7 error text.
const sqlFail = `UPDATE {{inbox}} SET
    state        = CASE WHEN $6::bool OR ($5::int > 0 AND attempts >= $5::int) THEN 'failed' ELSE 'in_flight' END,
    locked_until = CASE WHEN $6::bool OR ($5::int > 0 AND attempts >= $5::int) THEN NULL ELSE $4::timestamptz END,
    last_error   = $7,
    updated_at   = $4
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'
RETURNING state`

// sqlExtend renews a lease, fenced by its token. $1 scope, $2 key, $3 token,
// $4 new locked_until, $5 now.
const sqlExtend = `UPDATE {{inbox}} SET locked_until = $4, updated_at = $5
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'`

// sqlRelease deletes a key so that it can be claimed afresh. $1 scope, $2 key.
const sqlRelease = `DELETE FROM {{inbox}} WHERE scope = $1 AND key = $2`

// sqlReleaseIdle is sqlRelease that leaves a key in a live lease alone, in
// the same statement. $1 scope, $2 key, $3 now.
const sqlReleaseIdle = `DELETE FROM {{inbox}} WHERE scope = $1 AND key = $2
  AND NOT (state = 'in_flight' AND locked_until > $3)`

// sqlPurge deletes one bounded batch of expired keys, never one in a live
// lease. It walks the expires_at index and skips rows locked by others, so it
// neither scans the table nor waits on consumers. $1 cutoff, $2 now, $3 limit.
const sqlPurge = `DELETE FROM {{inbox}} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{inbox}}
    WHERE expires_at <= $1
      AND (state <> 'in_flight' OR locked_until IS NULL OR locked_until <= $2)
    ORDER BY expires_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED))`

// sqlStats counts keys by scope and state. $1 now.
const sqlStats = `SELECT scope, state, count(*),
    min(created_at) FILTER (WHERE state = 'in_flight'),
    count(*) FILTER (WHERE state = 'in_flight' AND locked_until > $1)
FROM {{inbox}} GROUP BY scope, state ORDER BY scope, state`

// queries holds the SQL of one Inbox with its table name filled in.
type queries struct {
	claimInsert, claim, claimBatch, lookup, lookupBatch, recordFailure, storeResult string
	complete, fail, extend, release, releaseIdle, purge, stats                      string
}

func newQueries(table string) queries {
	r := strings.NewReplacer("{{inbox}}", table)
	return queries{
		claimInsert:   r.Replace(sqlClaimInsert),
		claim:         r.Replace(sqlClaim),
		claimBatch:    r.Replace(sqlClaimBatch),
		lookup:        r.Replace(sqlLookup),
		lookupBatch:   r.Replace(sqlLookupBatch),
		recordFailure: r.Replace(sqlRecordFailure),
		storeResult:   r.Replace(sqlStoreResult),
		complete:      r.Replace(sqlComplete),
		fail:          r.Replace(sqlFail),
		extend:        r.Replace(sqlExtend),
		release:       r.Replace(sqlRelease),
		releaseIdle:   r.Replace(sqlReleaseIdle),
		purge:         r.Replace(sqlPurge),
		stats:         r.Replace(sqlStats),
	}
}
