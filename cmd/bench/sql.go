package main

// All SQL of the benchmark lives here. The hand-written statements are what
// a careful programmer would write without the library: they are the
// baselines the library is measured against, and they write and read the
// same rows the library does.

// sqlCreateEffects is the benchmark's business table.
const sqlCreateEffects = `CREATE TABLE IF NOT EXISTS bench_effects (
    id     bigserial PRIMARY KEY,
    msg_id text NOT NULL,
    body   text
)`

// sqlReset empties the tables between measured runs, so that every run,
// the library's and the hand-written one's, starts from the same state.
const sqlReset = `TRUNCATE bench_effects, dedupe_inbox, orders, hand_keys, dedupe_http_keys`

// sqlEffect is the effect of one message. $1 id, $2 body.
const sqlEffect = `INSERT INTO bench_effects (msg_id, body) VALUES ($1, $2)`

// sqlEffects is the effect of a batch. $1 ids, $2 body.
const sqlEffects = `INSERT INTO bench_effects (msg_id, body) SELECT unnest($1::text[]), $2`

// sqlHandClaim is the hand-written claim: insert the key with the row the
// inbox keeps (state, attempts, token, timestamps, expiry), or nothing when
// it exists. $1 scope, $2 key, $3 now, $4 expires_at.
const sqlHandClaim = `INSERT INTO dedupe_inbox (scope, key, state, attempts, token, created_at, updated_at, expires_at)
VALUES ($1, $2, 'complete', 1, 0, $3, $3, $4)
ON CONFLICT (scope, key) DO NOTHING
RETURNING 1`

// sqlHandClassify is the hand-written read of a key the claim found taken:
// what tells a duplicate (complete) from a key in flight, failed, or used
// with another payload. $1 scope, $2 key.
const sqlHandClassify = `SELECT state, attempts, locked_until, fingerprint FROM dedupe_inbox WHERE scope = $1 AND key = $2`

// sqlHandClaimBatch is the hand-written batch claim: the new keys of the
// batch come back. $1 scope, $2 keys (sorted), $3 now, $4 expires_at.
const sqlHandClaimBatch = `INSERT INTO dedupe_inbox (scope, key, state, attempts, token, created_at, updated_at, expires_at)
SELECT $1, k, 'complete', 1, 0, $3, $3, $4 FROM unnest($2::text[]) AS k
ON CONFLICT (scope, key) DO NOTHING
RETURNING key`

// sqlPreloadComplete writes complete keys $3 || '-' || 0..$2-1 of scope $1
// expiring at $4, as a consumer leaves them: the keys the duplicate rows
// are redelivered. Both sides of a duplicate row read rows written by it.
const sqlPreloadComplete = `INSERT INTO dedupe_inbox (scope, key, state, attempts, token, created_at, updated_at, expires_at)
SELECT $1, $3 || '-' || g, 'complete', 1, (random() * 9e18)::bigint + 1, now(), now(), $4
FROM generate_series(0, $2::bigint - 1) AS g`

// sqlPreloadHistory fills an inbox table with n complete keys of another
// scope, the history a long-running consumer accumulates. %s the table; $1
// n, $2 expires_at.
const sqlPreloadHistory = `INSERT INTO %s (scope, key, state, attempts, token, created_at, updated_at, expires_at)
SELECT 'history', 'h-' || g, 'complete', 1, (random() * 9e18)::bigint + 1, now(), now(), $2
FROM generate_series(1, $1::bigint) AS g`

// sqlResetOutbox empties the outbox between transport runs.
const sqlResetOutbox = `TRUNCATE dedupe_outbox`

// sqlOutboxBacklog writes a relay run's backlog as Outbox.Enqueue writes
// it: $2 messages on topic $1 with ids $3 || '-' || 0..$2-1, four of five
// keyed over $2/5 keys (about four messages per key, like the events of
// one order, so that per-key order is exercised), the fifth without a key.
const sqlOutboxBacklog = `INSERT INTO dedupe_outbox (message_id, topic, key, payload, next_attempt_at, created_at)
SELECT $3 || '-' || g, $1, CASE WHEN g % 5 = 4 THEN '' ELSE 'k' || (g % greatest($2::bigint / 5, 1)) END,
    convert_to($4, 'UTF8'), now(), now()
FROM generate_series(0, $2::bigint - 1) AS g`

// sqlHandRelayClaim is the hand-written relay's claim of a batch of pending
// rows, in per-key order: a keyed row only when no older row of its key is
// pending. $1 limit.
const sqlHandRelayClaim = `SELECT id, message_id, topic, payload FROM dedupe_outbox o
WHERE published_at IS NULL
  AND (key = '' OR NOT EXISTS (SELECT 1 FROM dedupe_outbox e
      WHERE e.topic = o.topic AND e.key = o.key AND e.id < o.id AND e.published_at IS NULL))
ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`

// sqlHandRelayMark marks a published batch. $1 ids.
const sqlHandRelayMark = `UPDATE dedupe_outbox SET published_at = now() WHERE id = ANY($1)`

// sqlDuplicatedEffects counts the effects beyond one per key: any is a
// broken guarantee, and a run that made one measures nothing worth printing.
const sqlDuplicatedEffects = `SELECT count(*) - count(DISTINCT msg_id) FROM bench_effects`
