// Package dedupenats gives NATS JetStream consumers exactly-once effects.
//
// A Runner pulls messages from a jetstream.Consumer with N workers and, for
// each message, begins a PostgreSQL transaction, claims the message's key in
// the dedupe inbox, runs the handler with that transaction, commits, and only
// then acknowledges the message with DoubleAck. A crash between the commit
// and the ack leads to a redelivery, which finds the committed claim and is
// acknowledged as a duplicate without running the handler again.
//
// The key is the Nats-Msg-Id header when present, else the stream name and
// stream sequence (see DefaultKey); set Config.Key to use a business key
// (HeaderKey). The scope is the durable consumer name.
//
// Outcomes map to broker actions:
//
//   - processed or duplicate: DoubleAck;
//   - handler error: NakWithDelay with Config.Backoff;
//   - a concurrent attempt holds the key: NakWithDelay(Config.InFlightDelay);
//   - poison (max attempts reached, or the handler returned
//     dedupe.Permanent), a key reused with another payload, or a message
//     without a usable key: Term. A poison key is recorded as failed in the
//     inbox (an operator may Release it); every termination is reported to
//     Metrics, which logs it at error level by default;
//   - database unavailable: NakWithDelay with Config.Backoff;
//   - shutdown while in flight: rolled back and Nak so another consumer
//     takes it at once. Uncommitted work is never acknowledged.
//
// While a handler runs, the Runner sends InProgress every Config.Heartbeat so
// that AckWait does not expire mid-transaction.
package dedupenats
