// Package dedupenats gives NATS JetStream consumers exactly-once effects.
//
// A Runner pulls messages from a jetstream.Consumer with N workers and, for
// each message, begins a PostgreSQL transaction, claims the message's key in
// the dedupe inbox, runs the handler with that transaction, commits, and only
// then acknowledges the message. A crash between the commit and the ack
// leads to a redelivery, which finds the committed claim and is acknowledged
// as a duplicate without running the handler again.
//
// The key is the Nats-Msg-Id header when present, else the stream name and
// stream sequence (see DefaultKey); set Config.Key to use a business key
// (HeaderKey). The scope is the durable consumer name.
//
// # Outcomes
//
// Every message ends in one visible state: its effect committed once, its key
// failed in the inbox (listed by dedupe inspect and Inbox.Stats), or a copy on
// Config.DeadLetterSubject. Outcomes map to broker actions:
//
//   - processed or duplicate: DoubleAck (or Ack, see Config.AckMode);
//   - handler error: NakWithDelay with Config.Backoff; an attempt;
//   - poison (max attempts reached, the handler returned dedupe.Permanent,
//     or a handler failure at the last delivery the consumer allows): the key
//     is recorded as failed, then Term. An operator may Release the key;
//   - a concurrent attempt holds the key: NakWithDelay(Config.InFlightDelay);
//   - database unreachable: not an attempt, and no delivery spent. The
//     message is held, marked in progress, and retried with Config.Backoff
//     (each failed try is reported as dedupe.EventRetried);
//   - a message without a usable key, or a key reused with another payload:
//     refused. It is recorded failed in the inbox under RefusedKey
//     ("dedupenats-refused/<stream>/<sequence>/<timestamp>", as the Kafka
//     runner does), copied to Config.DeadLetterSubject when set, then Term.
//     Without a dead-letter subject the record is required: while the
//     database cannot make it the message is naked with backoff (held at its
//     last delivery), never terminated unseen;
//   - shutdown: in-flight work gets Config.DrainTimeout to commit; what did
//     not commit is rolled back and handed back (Nak) with the buffered
//     messages, so another runner takes them at once. Uncommitted work is
//     never acknowledged, and a shutdown is not an attempt.
//
// # Observing
//
// The runner has no metrics of its own. The inbox's Observer
// (dedupe.Config.Observer; dedupeotel's for OpenTelemetry) is told of every
// handling, with the message's subject, Nats-Msg-Id, delivery count and
// headers (the handler finds them too, with dedupe.MessageInfoFrom), and of
// what the runner did beyond it, as dedupe.TransportEvent:
// dedupe.EventAckFailed, EventRetried (with the nak's delay),
// EventReleased, EventRefused, EventDeadLettered, EventDeadLetterFailed and
// EventTerminated. Config.Logger logs the same events that need attention.
//
// # Broker limits
//
// MaxDeliver. JetStream counts every delivery: the naks of a runner that
// stops, the redeliveries after a crash or an expired AckWait, copies naked
// because a concurrent attempt held the key. Only handler failures are
// attempts in the inbox, so with a finite MaxDeliver a message can reach its
// last delivery with attempts left, and when a delivery after which
// JetStream gives up ends in a Nak or an expired AckWait, the message is gone
// with only a server advisory to show for it. Use MaxDeliver -1 (the
// default of a consumer created without it): Config.MaxAttempts (the inbox's
// attempt limit) then decides when a message is poison, and poison is always
// recorded. With a finite MaxDeliver the Runner defends the last delivery
// (NumDelivered ≥ MaxDeliver): it does not nak it; a handler failure there is
// permanent (key failed); a message it has to give up on (a shutdown, a
// handler cancelled after DrainTimeout) is recorded as failed in the inbox,
// or, when the database cannot record it, published to
// Config.DeadLetterSubject (acknowledged by the stream), and only then
// terminated; when neither works it keeps the message alive and keeps trying,
// and Run does not return until it succeeds. What it cannot defend is a
// process killed with messages at their last delivery: JetStream drops those
// after AckWait. MaxAttempts must not exceed MaxDeliver.
//
// AckWait. Every message the Runner holds (buffered, being handled, held
// during a database outage, or being recorded at its last delivery) is
// marked in progress at least every Config.Heartbeat (a third of AckWait by
// default), by one shared timer. AckWait expires only for messages of a
// runner that died or lost its connection; their redelivery is absorbed by
// the inbox.
//
// MaxAckPending. JetStream stops delivering to the consumer while this many
// messages (1000 by default) are unacknowledged across all its runners. Each
// Runner holds up to Workers+MaxPending (Workers×BatchSize+MaxPending in
// batch mode), messages held during a database outage included, so an
// outage pauses deliveries instead of spending them. Set MaxAckPending to at
// least the number of runners times that, or some runners idle while others
// hold full buffers.
//
// The pull buffer (Config.MaxPending, default max(2×Workers, 64)). The Runner
// sends one pull request at a time, for the room it has, once half of
// MaxPending is free: one request per MaxPending/2 messages or so, about 1.03
// outgoing NATS messages per message with the ack (2.0 with the earlier
// buffer of one message per worker). Buffered messages are kept alive like
// running ones, so a large buffer behind slow handlers does not outlive
// AckWait; what a large buffer costs is fairness, since a slow runner holds
// its buffer while others idle. On shutdown the Runner reads the open pull
// request to its end (Config.PullExpiry) rather than drop messages in
// transit, and hands messages back only after that, so they are not
// delivered again into it. The consumer's MaxRequestBatch and
// MaxRequestExpires are respected.
//
// # DoubleAck or Ack
//
// DoubleAck (the default) waits for the server to confirm the ack, so an ack
// that did not arrive is reported (dedupe.EventAckFailed). Ack does not wait: a lost
// ack goes unreported, JetStream redelivers the message after AckWait, and
// the inbox acknowledges the copy as a duplicate without running the handler.
// The effect happens once either way; Ack saves the worker a round trip per
// message (about 10% more messages per second with 4 workers in
// BenchmarkPipeline) at the price of occasional redeliveries.
package dedupenats
