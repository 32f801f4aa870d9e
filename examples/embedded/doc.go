// Package embedded runs the brokers the examples talk to inside the
// example's own process, so that every example runs with no broker
// installed: a NATS server with JetStream (nats-server, the real server) and
// a Kafka-protocol broker (franz-go's kfake, a real implementation of the
// wire protocol that keeps its log in memory).
//
// The examples start them only when asked (their -embedded flag); by default
// they connect to the broker at the address they are given. Neither embedded
// broker is meant for production: the NATS server stores its streams in a
// temporary directory removed by Close, and kfake keeps everything in
// memory.
//
// The package is an ordinary public package (it does not import testing),
// so a program copied from an example keeps building.
package embedded
