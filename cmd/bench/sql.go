package main

// All SQL of the benchmark lives here. The hand-written statements are what
// a careful programmer would write without the library: they are the
// baselines the library is measured against.

// sqlCreateEffects is the benchmark's business table.
const sqlCreateEffects = `CREATE TABLE IF NOT EXISTS bench_effects (
    id     bigserial PRIMARY KEY,
    msg_id text NOT NULL,
    body   text
)`

// sqlReset empties the tables between rows of the report.
const sqlReset = `TRUNCATE bench_effects, dedupe_inbox`

// sqlEffect is the effect of one message. $1 id, $2 body.
const sqlEffect = `INSERT INTO bench_effects (msg_id, body) VALUES ($1, $2)`

// sqlEffects is the effect of a batch. $1 ids, $2 body.
const sqlEffects = `INSERT INTO bench_effects (msg_id, body) SELECT unnest($1::text[]), $2`

// sqlHandClaim is the hand-written claim: insert the key, or nothing when it
// exists. $1 scope, $2 key, $3 now, $4 expires_at.
const sqlHandClaim = `INSERT INTO dedupe_inbox (scope, key, state, attempts, token, created_at, updated_at, expires_at)
VALUES ($1, $2, 'complete', 1, 0, $3, $3, $4)
ON CONFLICT (scope, key) DO NOTHING
RETURNING 1`

// sqlHandClaimBatch is the hand-written batch claim: the new keys of the
// batch come back. $1 scope, $2 keys (sorted), $3 now, $4 expires_at.
const sqlHandClaimBatch = `INSERT INTO dedupe_inbox (scope, key, state, attempts, token, created_at, updated_at, expires_at)
SELECT $1, k, 'complete', 1, 0, $3, $3, $4 FROM unnest($2::text[]) AS k
ON CONFLICT (scope, key) DO NOTHING
RETURNING key`

// sqlPreload fills the inbox with n complete keys of another scope, the
// history a long-running consumer accumulates. $1 n, $2 expires_at.
const sqlPreload = `INSERT INTO dedupe_inbox (scope, key, state, attempts, token, created_at, updated_at, expires_at)
SELECT 'history', 'h-' || g, 'complete', 1, 0, now(), now(), $2
FROM generate_series(1, $1::bigint) AS g`

// sqlAnalyze refreshes the planner's statistics after a preload.
const sqlAnalyze = `ANALYZE dedupe_inbox`

// sqlResetOutbox empties the outbox between rows of the transport table.
const sqlResetOutbox = `TRUNCATE dedupe_outbox`

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
