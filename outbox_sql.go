package dedupe

import "strings"

// All SQL of the outbox and its relay lives here. {{outbox}} is replaced by
// the quoted, optionally schema-qualified outbox table.
//
// Per-key order. Rows are ordered by id, and the relay publishes the rows of
// one (topic, key) in id order. Two things make id order the commit order of
// a key and keep a key from being in flight twice:
//
//   - Enqueue takes a transaction-scoped advisory lock on the (topic, key)
//     before the row's id is drawn, so a second transaction enqueueing the
//     same key waits until the first commits or rolls back, and then draws a
//     larger id. Without it, two writers could commit in the opposite order
//     of their ids and the relay could publish the later id first.
//   - The relay owns a key by locking its head: the oldest pending row of
//     the key. A row is claimable only when no older row of its key is
//     pending, so while one relay holds a head locked, another relay skips
//     it (SKIP LOCKED) and finds none of the key's later rows claimable
//     either (the head is still pending). The owner then takes the key's
//     later rows too and publishes them one after another.
//
// Rows with an empty key have no order and are all claimable.

// sqlOutboxEnqueueLock takes the key's advisory lock (not for an empty key)
// before the row's id is drawn; sqlOutboxEnqueueInsert inserts from it.
// $1 message id, $2 topic, $3 key, $4 headers, $5 payload, $6 now, $7 lock
// seed (per table). An id already in the outbox inserts nothing.
const (
	sqlOutboxEnqueueLock = `WITH lock AS MATERIALIZED (
    SELECT count(*) AS n FROM (
        SELECT pg_advisory_xact_lock(hashtextextended($2::text || '/' || $3::text, $7::bigint))
        WHERE $3::text <> '') l
)`
	sqlOutboxEnqueueInsert = `INSERT INTO {{outbox}} (message_id, topic, key, headers, payload, next_attempt_at, created_at)
SELECT $1, $2, $3, $4, $5, $6, $6 FROM lock
ON CONFLICT (message_id) DO NOTHING`
)

// sqlOutboxEnqueue inserts one message and notifies the relays at commit.
const sqlOutboxEnqueue = sqlOutboxEnqueueLock + `, ins AS (
` + sqlOutboxEnqueueInsert + `
    RETURNING tableoid
)
SELECT pg_notify('` + outboxChannelPrefix + `' || tableoid::text, '') FROM ins`

// sqlOutboxEnqueueQuiet is sqlOutboxEnqueue without the notification.
const sqlOutboxEnqueueQuiet = sqlOutboxEnqueueLock + `
` + sqlOutboxEnqueueInsert

// outboxChannelPrefix prefixes the table's oid to name its NOTIFY channel, so
// that outboxes in different schemas do not wake each other's relays.
const outboxChannelPrefix = "dedupe_outbox_"

// sqlOutboxChannel returns the NOTIFY channel of the table. $1 the quoted,
// qualified table name.
const sqlOutboxChannel = `SELECT '` + outboxChannelPrefix + `' || $1::regclass::oid::text`

// outboxColumns is the column list scanned by scanOutboxMessage.
const outboxColumns = `o.id, o.message_id, o.topic, o.key, o.headers, o.payload, o.attempts,
    o.next_attempt_at, o.parked_at, o.last_error, o.created_at`

// sqlOutboxWindow returns the ids of the oldest pending rows after a cursor:
// the candidates of one cycle. Bounding them bounds the work of
// sqlOutboxClaimHeads when a long backlog of a few keys makes most pending
// rows non-heads; the relay moves the cursor on when a window holds too few
// heads. $1 cursor, $2 window size.
const sqlOutboxWindow = `SELECT id FROM {{outbox}} WHERE published_at IS NULL AND id > $1 ORDER BY id LIMIT $2`

// sqlOutboxClaimHeads locks up to $2 due rows among the candidates $3 that
// head their key (or have none), skipping rows other relays hold. The
// conditions on o are rechecked on the newest row version when a row was
// changed since the snapshot, so a row just published by another relay is
// not taken. $1 now, $2 limit, $3 candidate ids.
const sqlOutboxClaimHeads = `SELECT ` + outboxColumns + `
FROM {{outbox}} o
WHERE o.id = ANY($3::bigint[])
  AND o.published_at IS NULL AND o.parked_at IS NULL AND o.next_attempt_at <= $1
  AND (o.key = '' OR NOT EXISTS (
      SELECT 1 FROM {{outbox}} e
      WHERE e.topic = o.topic AND e.key = o.key AND e.id < o.id AND e.published_at IS NULL))
ORDER BY o.id
LIMIT $2
FOR UPDATE OF o SKIP LOCKED`

// sqlOutboxClaimFollowers locks the pending rows that follow the heads this
// relay owns, in id order. No other relay can hold them (their key's head is
// ours), so it does not skip. $1 topics, $2 keys, $3 head ids, $4 limit.
const sqlOutboxClaimFollowers = `SELECT ` + outboxColumns + `
FROM {{outbox}} o
JOIN unnest($1::text[], $2::text[], $3::bigint[]) AS h(topic, key, head)
  ON o.topic = h.topic AND o.key = h.key AND o.id > h.head
WHERE o.published_at IS NULL
ORDER BY o.id
LIMIT $4
FOR UPDATE OF o`

// sqlOutboxMarkPublished marks confirmed rows. $1 ids, $2 now.
const sqlOutboxMarkPublished = `UPDATE {{outbox}} SET published_at = $2, last_error = NULL WHERE id = ANY($1)`

// sqlOutboxDeletePublished deletes confirmed rows (RelayConfig.DeletePublished). $1 ids.
const sqlOutboxDeletePublished = `DELETE FROM {{outbox}} WHERE id = ANY($1)`

// sqlOutboxRecordFailures counts failed publishes, schedules their retries
// and parks those given a park time. $1 ids, $2 errors, $3 next attempts,
// $4 park times (NULL to keep retrying).
const sqlOutboxRecordFailures = `UPDATE {{outbox}} AS o SET
    attempts = o.attempts + 1, last_error = f.err, next_attempt_at = f.next, parked_at = f.parked
FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::timestamptz[]) AS f(id, err, next, parked)
WHERE o.id = f.id`

// sqlOutboxCleanup deletes one bounded batch of published rows older than the
// retention, skipping rows others hold. $1 cutoff, $2 limit.
const sqlOutboxCleanup = `DELETE FROM {{outbox}} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{outbox}}
    WHERE published_at IS NOT NULL AND published_at <= $1
    ORDER BY published_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED))`

// sqlOutboxStats counts pending and parked rows and the oldest pending one.
const sqlOutboxStats = `SELECT count(*) FILTER (WHERE parked_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL),
    min(created_at) FILTER (WHERE parked_at IS NULL)
FROM {{outbox}} WHERE published_at IS NULL`

// sqlOutboxParked lists parked rows, oldest first. $1 limit.
const sqlOutboxParked = `SELECT ` + outboxColumns + ` FROM {{outbox}} o
WHERE o.published_at IS NULL AND o.parked_at IS NOT NULL ORDER BY o.id LIMIT $1`

// sqlOutboxUnpark returns a parked row to the relay with fresh attempts.
// $1 message id, $2 now.
const sqlOutboxUnpark = `UPDATE {{outbox}} SET parked_at = NULL, attempts = 0, next_attempt_at = $2
WHERE message_id = $1 AND parked_at IS NOT NULL AND published_at IS NULL`

// outboxQueries holds the SQL of one Outbox with its table name filled in.
type outboxQueries struct {
	enqueue, enqueueQuiet, channel, window, claimHeads, claimFollowers, markPublished, deletePublished string
	recordFailures, cleanup, stats, parked, unpark                                                     string
}

func newOutboxQueries(table string) outboxQueries {
	r := strings.NewReplacer("{{outbox}}", table)
	return outboxQueries{
		enqueue:         r.Replace(sqlOutboxEnqueue),
		enqueueQuiet:    r.Replace(sqlOutboxEnqueueQuiet),
		channel:         sqlOutboxChannel,
		window:          r.Replace(sqlOutboxWindow),
		claimHeads:      r.Replace(sqlOutboxClaimHeads),
		claimFollowers:  r.Replace(sqlOutboxClaimFollowers),
		markPublished:   r.Replace(sqlOutboxMarkPublished),
		deletePublished: r.Replace(sqlOutboxDeletePublished),
		recordFailures:  r.Replace(sqlOutboxRecordFailures),
		cleanup:         r.Replace(sqlOutboxCleanup),
		stats:           r.Replace(sqlOutboxStats),
		parked:          r.Replace(sqlOutboxParked),
		unpark:          r.Replace(sqlOutboxUnpark),
	}
}
