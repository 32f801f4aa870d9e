// Package shipping is what the consumer examples (nats-consumer,
// rabbitmq-consumer, redis-consumer) have in common beside dedupe: the
// order a message carries and the shipments table its handler writes, one
// row per order, in the transaction that holds the message's claim.
//
// It is a library that the examples share, not an example: there is nothing
// to run here (the programs are the directories of examples/ that have a
// README). It is public, like the rest of what the examples import, so that
// a program copied out of examples/ builds.
package shipping
