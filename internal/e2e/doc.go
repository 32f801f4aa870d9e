// Package e2e holds the end-to-end test of the chain the library is for:
// service A consumes an input stream through the NATS adapter with its inbox
// and, in the same transaction, enqueues a follow-up in its outbox; a relay
// publishes the follow-up to JetStream; service B consumes it through the
// NATS adapter with its own inbox. Faults are injected at every step, and
// B's effects must equal the unique inputs exactly.
package e2e
