// Package embedded runs a NATS server with JetStream (nats-server, the real
// server) inside an example's own process, so that the NATS examples and the
// quickstart run with no broker installed. The Kafka example's in-process
// broker is package embeddedkafka, apart, so that a NATS program does not
// compile it.
//
// The examples start it only when asked (their -embedded flag; the
// quickstart always); by default they connect to the broker at the address
// they are given. It is not meant for production: the server stores its
// streams in a temporary directory removed by Close.
//
// The package is an ordinary public package (it does not import testing),
// so a program copied from an example keeps building.
//
// It is a library that the examples share, not an example: there is nothing
// to run here (the programs are the directories of examples/ that have a
// README).
package embedded
