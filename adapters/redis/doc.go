// Package deduperedis gives Redis Streams consumers exactly-once effects.
//
// A Runner reads a stream through a consumer group (XREADGROUP; the group is
// created with MKSTREAM when missing) with N workers and, for each entry,
// begins a PostgreSQL transaction, claims the entry's key in the dedupe
// inbox, runs the handler with that transaction, commits, and only then
// acknowledges the entry (XACK). A crash between the commit and the XACK
// leaves the entry pending; another consumer reclaims it after
// Config.ClaimIdle (XAUTOCLAIM), finds the committed claim and acknowledges
// it as a duplicate without running the handler again.
//
// The key is the entry's "id" field (DefaultKey; FieldKey for another
// field). The entry id Redis assigns is no dedup key by default, because a
// producer that retries an XADD adds a second entry with a new id; EntryKey
// opts in to it. The scope is the group's name.
//
// # Outcomes
//
// Every entry ends in one visible state: its effect committed once, its key
// failed in the inbox (listed by dedupe inspect and Inbox.Stats), with a
// copy on Config.DeadLetterStream when one is set. Outcomes map to Redis
// actions:
//
//   - processed or duplicate: XACK;
//   - handler error: the runner keeps the entry (its idle time reset every
//     Config.Heartbeat, so no other consumer takes it) and tries it again
//     after Config.Backoff; an attempt, counted by the inbox;
//   - poison (Config.MaxAttempts used up, or the handler returned
//     dedupe.Permanent): the key is recorded failed by the same step that
//     counts the attempt; then the dead-letter copy and the XACK go in one
//     MULTI/EXEC. An operator may Release the key;
//   - an entry without a usable key, a key reused with another payload
//     (Config.Fingerprint), or a pending entry whose body was trimmed away
//     (ErrTrimmed): refused. RefusedKey is recorded failed in the inbox
//     first, then the copy and the XACK;
//   - an entry the group delivered more than Config.MaxDeliveries times
//     (Redis's delivery counter, from XPENDING: each consumer that took it
//     died or stalled, as one killed by the entry would): recorded failed
//     under its key without running the handler, then copy and XACK;
//   - a concurrent attempt holds the key: kept, tried again after
//     Config.InFlightDelay;
//   - database unreachable: not an attempt; kept and tried again with
//     Config.Backoff;
//   - shutdown: in-flight work gets Config.DrainTimeout to commit; what did
//     not commit is rolled back and stays pending, for another consumer to
//     reclaim after ClaimIdle (Redis has no way to hand an entry back at
//     once). Uncommitted work is never acknowledged.
//
// An entry is never acknowledged before it is recorded: when the database
// cannot record a refused or too-often-delivered entry, it stays pending
// and is tried again.
//
// # Trimming safely
//
// XADD … MAXLEN / MINID and XTRIM delete the oldest entries whether or not
// a group has acknowledged them. A pending entry whose body is gone cannot
// be handled: when the runner reclaims it, Redis 7 drops it from the
// group's pending list and names it (XAUTOCLAIM's deleted ids), and the
// runner records it failed under RefusedKey with ErrTrimmed, reports it to
// the Observer (dedupe.EventRefused, then EventTerminated) and adds a copy
// holding only its id to Config.DeadLetterStream. Its fields are lost
// all the same (and a process that dies between XAUTOCLAIM and the record
// loses the report too). To trim without losing entries:
//
//   - trim by MINID below the oldest pending entry of every group (the
//     smallest id XPENDING reports per group, or the group's last-delivered
//     id when nothing is pending), not by MAXLEN; or
//   - with MAXLEN, keep the stream much longer than the backlog can grow
//     while a consumer is down (rate × the longest outage) and alert on
//     the group's lag (XINFO GROUPS) before it reaches that length; or
//   - on Redis 8.2 or newer, trim with the ACKED option (XADD/XTRIM … ACKED),
//     which deletes only entries every group has acknowledged.
//
// Retention of the inbox (dedupe.Config.Retention) must outlive the
// longest time an entry can stay pending and be redelivered.
//
// # Redis failures
//
// go-redis reconnects by itself; the runner retries a failed read with
// Config.Backoff. An XACK that fails (connection lost after the commit) is
// reported (dedupe.EventAckFailed); the entry stays pending, is reclaimed
// after ClaimIdle and acknowledged as a duplicate. When the group is gone
// (NOGROUP: Redis restarted without persistence, or the stream was
// deleted), the runner creates it again at id 0, so it reads everything
// added since; what the lost stream still held is gone with it, and is
// visible only to its producers. The effects committed before stay in the
// inbox, so an entry added again by a producer is absorbed as a duplicate.
//
// # Observing
//
// The runner has no metrics of its own. The inbox's Observer
// (dedupe.Config.Observer; dedupeotel's for OpenTelemetry) is told of every
// handling, with the entry's stream, id, delivery count and fields (the
// handler finds them too, with dedupe.MessageInfoFrom; the trace context
// OutboxPublisher writes as the traceparent and tracestate fields), and of
// what the runner did beyond it, as dedupe.TransportEvent:
// dedupe.EventAckFailed, EventRetried, EventReleased, EventRefused,
// EventDeadLettered, EventDeadLetterFailed and EventTerminated.
// Config.Logger logs the same events that need attention.
package deduperedis
