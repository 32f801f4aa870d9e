// Package embeddedkafka runs a Kafka-protocol broker inside the example's
// own process (franz-go's kfake, a real implementation of the wire protocol
// that keeps its log in memory), so that the Kafka example runs with no
// broker installed (its -embedded flag). It is not meant for production.
//
// It is a package of its own, apart from package embedded's NATS server,
// so that a program that runs only NATS (the quickstart) does not compile
// kfake. It does not import testing: a program copied from an example keeps
// building.
//
// It is a library that the examples share, not an example: there is nothing
// to run here (the programs are the directories of examples/ that have a
// README).
package embeddedkafka
