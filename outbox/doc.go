// Package outbox is dedupe's transactional outbox: a service writes the
// messages it means to publish into an outbox table in the same transaction
// as its own writes (Outbox.Enqueue), and a Relay publishes them through a
// Publisher once that transaction committed, at least once and in commit
// order per key. The consumers deduplicate by Message.ID, with a dedupe
// inbox: together, a message's effects happen once from the producer's
// commit to the consumer's.
//
// The outbox table is created by dedupe.Migrate (its LineOutbox), like the
// inbox's. The JetStream and Kafka publishers live in the NATS and Kafka
// adapters (dedupenats.NewOutboxPublisher, dedupekafka.NewOutboxPublisher); any other
// broker is a Publisher or a PublishFunc.
//
//	ob, err := outbox.New(pool, outbox.Config{}) // or outbox.NewFor(inbox, ...): its pool and settings
//	...
//	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		// ... the service's own writes in tx ...
//		_, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders.created", Key: orderID, Payload: body})
//		return err
//	})
//	...
//	relay, err := outbox.NewRelay(ob, publisher, outbox.RelayConfig{})
//	go relay.Run(ctx)
//
// The package imports the root package (dedupe's DB, errors and
// migrations); the root never imports it. Its hooks for metrics and traces
// are its own Observer, which the dedupeotel module implements.
package outbox
