// Package dedupewatermill gives Watermill handlers exactly-once effects,
// whatever Pub/Sub feeds the router (AMQP, SQS, Google Pub/Sub, Redis,
// Kafka, SQL, the in-process GoChannel...).
//
// Middleware is a router middleware (message.HandlerMiddleware): for each
// message it begins a PostgreSQL transaction, claims the message's key in
// the dedupe inbox, runs the Watermill handler with the transaction in the
// message's context (Tx), commits, and only then returns to the router,
// which acknowledges the message. A redelivery of a message whose effects
// committed is acknowledged without running the handler. Unlike Watermill's
// own Deduplicator middleware, which keeps keys in one process's memory, the
// claim is in the database, shared by every router and every process, and
// commits atomically with the handler's writes.
//
// The key is the message's UUID (UUIDKey) or a metadata entry of the
// user's choice (MetadataKey). The scope is Config.Scope.
//
// # Outcomes
//
//   - processed, or a duplicate of one that committed: the handler returns
//     nil to the router, which acks;
//   - the handler failed, a concurrent attempt holds the key, the database
//     failed: the error goes to the router, which nacks (the Pub/Sub
//     redelivers; put Watermill's Retry middleware outside this one for a
//     backoff). A handler failure is an attempt, counted by the inbox;
//   - poison (Config.MaxAttempts used up, or dedupe.Permanent): the key is
//     recorded failed. Without Config.ReturnPoison the message is then
//     acknowledged (the inbox's failed record, the log and the Observer's
//     dedupe.EventTerminated keep it visible). With it, an error matching
//     ErrPoison goes to the router, for Watermill's poison-queue middleware
//     (middleware.PoisonQueueWithFilter(pub, topic, IsPoison)), placed
//     before this one in AddMiddleware, to copy and ack;
//   - no usable key, or a key reused with another payload
//     (Config.Fingerprint): refused. RefusedKey is recorded failed first
//     (a database failure nacks), then it is poison, as above.
//
// # Produced messages
//
// Messages the handler returns are, with Config.Outbox, written to the
// transactional outbox in the handler's transaction (to Config.OutboxTopic,
// else the handler's publish topic) and returned to the router as none: they
// exist if and only if the effects committed, and a outbox.Relay publishes
// them, through RelayPublisher to any Watermill publisher. Without
// Config.Outbox the router publishes them after the commit, at most once:
// if that publish fails the router nacks, and the redelivery is a duplicate
// whose handler does not run again. OutboxPublisher is a message.Publisher
// over the outbox for handlers that publish themselves (a CQRS EventBus):
// it writes into the transaction of the message's context.
//
// # Observing
//
// The inbox's Observer (dedupe.Config.Observer; dedupeotel's for
// OpenTelemetry) is told of every handling, with the message's UUID, the
// subscribed topic and its metadata (the trace context a publisher wrote),
// and of dedupe.EventRefused, EventRetried (a nack) and EventTerminated.
package dedupewatermill
