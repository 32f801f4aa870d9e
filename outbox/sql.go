package outbox

import (
	"strings"
	"time"
)

// All SQL of the outbox and its relay lives here. {{outbox}} is replaced by
// the quoted, optionally schema-qualified outbox table.
//
// Time. Every time a statement stores or compares is the database's
// clock_timestamp() when the statement runs (now() would be the start of the
// transaction), never the application's clock: the parameter named "now" is
// NULL unless Config.Clock was set, a test seam that substitutes for the
// database's clock. Durations travel as seconds (float8).
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
//     later rows too and publishes them one after another. A parked or not
//     yet due head is pending as well: its key waits.
//
// Rows with an empty key have no order and are all claimable. A row leaves
// the pending rows (published_at IS NULL) when the broker confirmed it or an
// operator discarded it (discarded_at is set too).

// sqlNow is the statement's "now": the parameter when set (Config.Clock, a
// test seam), else the database's clock when the statement runs.
func sqlNow(param string) string {
	return "coalesce(" + param + "::timestamptz, clock_timestamp())"
}

// sqlOutboxEnqueueLock takes the key's advisory lock (not for an empty key)
// before the row's id is drawn; sqlOutboxEnqueueInsert inserts from it.
// $1 message id, $2 topic, $3 key, $4 headers, $5 payload, $6 now, $7 lock
// seed (per table). An id already in the outbox inserts nothing.
var (
	sqlOutboxEnqueueLock = `WITH lock AS MATERIALIZED (
    SELECT count(*) AS n FROM (
        SELECT pg_advisory_xact_lock(hashtextextended($2::text || '/' || $3::text, $7::bigint))
        WHERE $3::text <> '') l
)`
	sqlOutboxEnqueueInsert = `INSERT INTO {{outbox}} (message_id, topic, key, headers, payload, next_attempt_at, created_at)
SELECT $1, $2, $3, $4, $5, n.now, n.now FROM lock, (SELECT ` + sqlNow("$6") + ` AS now) n
ON CONFLICT (message_id) DO NOTHING`
)

// sqlOutboxEnqueue inserts one message and notifies the relays at commit.
var sqlOutboxEnqueue = sqlOutboxEnqueueLock + `, ins AS (
` + sqlOutboxEnqueueInsert + `
    RETURNING tableoid
)
SELECT pg_notify('` + outboxChannelPrefix + `' || tableoid::text, '') FROM ins`

// sqlOutboxEnqueueQuiet is sqlOutboxEnqueue without the notification.
var sqlOutboxEnqueueQuiet = sqlOutboxEnqueueLock + `
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

// sqlOutboxClaim claims a batch in one statement. It walks the pending index
// in id order from the first pending row after the relay's cursor, within a
// window of ids, and locks up to $4 due heads (rows with no older pending row
// of their key, checked inline with one probe of the key index; rows without
// a key skip the probe), skipping rows other relays hold. When that leaves
// room, it adds the later rows of the keys whose heads it locked, in id order,
// each key up to its first row that is parked or not yet due; no other relay
// can hold those (their head is locked here), so it does not skip.
//
// The conditions on o are rechecked on the newest row version when a row was
// changed since the snapshot, so a row another relay just published or
// rescheduled is not taken.
//
// It returns one row per claimed message, or a single row of NULLs when
// nothing was claimed, each led by lo (the first pending id after the cursor
// that is not parked, NULL when there is none: the window starts there), beyond (rows exist past the window: one
// probe of the primary key's end, so they may be published already) and
// head (a head, or a later row of its key).
// $1 now, $2 cursor, $3 window, $4 batch size.
var sqlOutboxClaim = `WITH w AS MATERIALIZED (
    SELECT (SELECT id FROM {{outbox}} WHERE published_at IS NULL AND parked_at IS NULL AND id > $2
        ORDER BY id LIMIT 1) AS lo
),
b AS MATERIALIZED (
    SELECT ` + sqlNow("$1") + ` AS now, w.lo,
        coalesce((SELECT max(id) FROM {{outbox}}) >= w.lo + $3, false) AS beyond
    FROM w
),
h AS MATERIALIZED (
    SELECT ` + outboxColumns + `
    FROM {{outbox}} o
    WHERE o.published_at IS NULL
      AND o.id >= (SELECT lo FROM b) AND o.id < (SELECT lo FROM b) + $3
      AND o.parked_at IS NULL AND o.next_attempt_at <= (SELECT now FROM b)
      AND (o.key = '' OR NOT EXISTS (
          SELECT 1 FROM {{outbox}} e
          WHERE e.topic = o.topic AND e.key = o.key AND e.id < o.id AND e.published_at IS NULL))
    ORDER BY o.id
    LIMIT $4
    FOR UPDATE OF o SKIP LOCKED
),
f AS MATERIALIZED (
    SELECT ` + outboxColumns + `
    FROM {{outbox}} o
    WHERE o.id = ANY (ARRAY(
        SELECT l.id FROM h CROSS JOIN LATERAL (
            SELECT y.id, bool_and(y.parked_at IS NULL AND y.next_attempt_at <= (SELECT now FROM b)) OVER (ORDER BY y.id) AS ok
            FROM {{outbox}} y
            WHERE y.topic = h.topic AND y.key = h.key AND y.id > h.id AND y.published_at IS NULL
            ORDER BY y.id
            LIMIT $4 - (SELECT count(*) FROM h)) l
        WHERE h.key <> '' AND l.ok
        ORDER BY l.id
        LIMIT $4 - (SELECT count(*) FROM h)))
      AND o.published_at IS NULL
    FOR UPDATE OF o
)
SELECT b.lo, b.beyond, c.* FROM b LEFT JOIN (
    SELECT true AS head, * FROM h UNION ALL SELECT false, * FROM f) c ON true`

// sqlNowParam selects the statement's now once, as n.now.
func sqlNowParam(param string) string { return "(SELECT " + sqlNow(param) + " AS now) n" }

// sqlOutboxMarkPublished marks confirmed rows. $1 ids, $2 now.
var sqlOutboxMarkPublished = `UPDATE {{outbox}} o SET published_at = (SELECT ` + sqlNow("$2") + `), last_error = NULL
WHERE o.id = ANY($1)`

// sqlOutboxMarkPublishedLag is sqlOutboxMarkPublished returning each row's
// lag from enqueue to confirmation in seconds, for the Observer.
var sqlOutboxMarkPublishedLag = sqlOutboxMarkPublished + `
RETURNING o.id, extract(epoch FROM o.published_at - o.created_at)::float8`

// sqlOutboxDeletePublished deletes confirmed rows (RelayConfig.DeletePublished). $1 ids.
const sqlOutboxDeletePublished = `DELETE FROM {{outbox}} WHERE id = ANY($1)`

// sqlOutboxDeletePublishedLag is sqlOutboxDeletePublished returning the lags.
// $1 ids, $2 now.
var sqlOutboxDeletePublishedLag = `DELETE FROM {{outbox}} o USING ` + sqlNowParam("$2") + `
WHERE o.id = ANY($1)
RETURNING o.id, extract(epoch FROM n.now - o.created_at)::float8`

// sqlOutboxRecordFailures counts failed publishes, schedules their retries
// after their delays and parks those marked to park. $1 ids, $2 errors,
// $3 delays in seconds, $4 park, $5 now.
var sqlOutboxRecordFailures = `UPDATE {{outbox}} AS o SET
    attempts = o.attempts + 1, last_error = f.err,
    next_attempt_at = n.now + f.delay * interval '1 second',
    parked_at = CASE WHEN f.park THEN n.now END
FROM unnest($1::bigint[], $2::text[], $3::float8[], $4::bool[]) AS f(id, err, delay, park), ` + sqlNowParam("$5") + `
WHERE o.id = f.id`

// sqlOutboxCleanup deletes one bounded batch of rows published (or
// discarded) longer ago than the retention, skipping rows others hold.
// $1 now, $2 retention in seconds, $3 limit.
var sqlOutboxCleanup = `DELETE FROM {{outbox}} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{outbox}}
    WHERE published_at IS NOT NULL AND published_at <= (SELECT ` + sqlNow("$1") + `) - $2::float8 * interval '1 second'
    ORDER BY published_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED))`

// sqlOutboxStats counts pending and parked rows and the age in seconds of
// the oldest pending one. $1 now.
var sqlOutboxStats = `SELECT count(*) FILTER (WHERE parked_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL),
    extract(epoch FROM (SELECT ` + sqlNow("$1") + `) - min(created_at) FILTER (WHERE parked_at IS NULL))::float8
FROM {{outbox}} WHERE published_at IS NULL`

// sqlOutboxParked lists parked rows, oldest first. $1 limit.
const sqlOutboxParked = `SELECT ` + outboxColumns + ` FROM {{outbox}} o
WHERE o.published_at IS NULL AND o.parked_at IS NOT NULL ORDER BY o.id LIMIT $1`

// sqlOutboxUnpark returns a parked row to the relay with fresh attempts.
// $1 message id, $2 now.
var sqlOutboxUnpark = `UPDATE {{outbox}} SET parked_at = NULL, attempts = 0, next_attempt_at = ` + sqlNow("$2") + `
WHERE message_id = $1 AND parked_at IS NOT NULL AND published_at IS NULL`

// sqlOutboxDiscard takes a parked row out of the pending rows for good,
// recording who discarded it, when and why; the later rows of its key move
// up. The row is kept (for Retention, like a published one) as the record.
// $1 message id, $2 by, $3 reason, $4 now.
var sqlOutboxDiscard = `UPDATE {{outbox}} o SET published_at = n.now, discarded_at = n.now, discarded_by = $2, discard_reason = $3
FROM ` + sqlNowParam("$4") + `
WHERE o.message_id = $1 AND o.parked_at IS NOT NULL AND o.published_at IS NULL
RETURNING ` + outboxColumns + `, o.discarded_at`

// outboxQueries holds the SQL of one Outbox with its table name filled in.
type outboxQueries struct {
	enqueue, enqueueQuiet, channel, claim                                string
	markPublished, markPublishedLag, deletePublished, deletePublishedLag string
	recordFailures, cleanup, stats, parked, unpark, discard              string
}

func newOutboxQueries(table string) outboxQueries {
	r := strings.NewReplacer("{{outbox}}", table)
	return outboxQueries{
		enqueue:            r.Replace(sqlOutboxEnqueue),
		enqueueQuiet:       r.Replace(sqlOutboxEnqueueQuiet),
		channel:            sqlOutboxChannel,
		claim:              r.Replace(sqlOutboxClaim),
		markPublished:      r.Replace(sqlOutboxMarkPublished),
		markPublishedLag:   r.Replace(sqlOutboxMarkPublishedLag),
		deletePublished:    r.Replace(sqlOutboxDeletePublished),
		deletePublishedLag: r.Replace(sqlOutboxDeletePublishedLag),
		recordFailures:     r.Replace(sqlOutboxRecordFailures),
		cleanup:            r.Replace(sqlOutboxCleanup),
		stats:              r.Replace(sqlOutboxStats),
		parked:             r.Replace(sqlOutboxParked),
		unpark:             r.Replace(sqlOutboxUnpark),
		discard:            r.Replace(sqlOutboxDiscard),
	}
}

// The outbox and its relay take every time they store or compare from the
// database (clock_timestamp() when the statement runs; see the top of this file).
// Config.Clock is only a test seam that substitutes for the database's clock
// when the caller set it.

// dbNow is the "now" parameter of the outbox's statements: nil (SQL then
// takes the database's clock) unless the caller set Config.Clock.
func (o *Outbox) dbNow() *time.Time { return o.cfg.now() }

// seconds passes a duration to SQL as seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }

// fromSeconds reads a duration SQL computed in seconds.
func fromSeconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
