// Package dedupeotel reports what dedupe does as OpenTelemetry spans and
// metrics: an implementation of dedupe.Observer.
//
//	obs, err := dedupeotel.New(dedupeotel.Config{}) // the global providers and propagator
//	inbox, err := dedupe.New(pool, dedupe.Config{Observer: obs})
//	stop, err := obs.ObserveStats(inbox, outbox) // the gauges
//
// # Dependencies
//
// The core module depends on no OpenTelemetry module at all: its Observer
// seam and its Headers type (the shape of propagation.TextMapCarrier) are
// plain Go, so a program that imports only the core has the same module
// graph as before. This module depends on the OpenTelemetry API only
// (go.opentelemetry.io/otel, otel/trace, otel/metric), never on the SDK or
// an exporter: the program chooses those (see the otelsetup module, which
// configures them from the standard OTEL_* environment variables).
//
// # Traces
//
// Spans follow the OpenTelemetry messaging semantic conventions
// (semconv v1.40.0):
//
//   - "create {topic}" (producer): Outbox.Enqueue, in the caller's trace.
//     Its context is injected into the message's headers with the
//     propagator, stored with the outbox row and published with the message
//     (NATS headers, Kafka record headers), so it is the message's creation
//     context. It lasts no time: it marks where the message was created.
//   - "send {topic}" (producer): one relay publish of an outbox message, a
//     child of (and linked to) the message's creation context.
//   - "process {destination or scope}" (consumer): one handling of a message
//     (Consumer.Handle, each message of BatchConsumer.HandleBatch, and
//     Inbox.Begin to Complete or Fail). The creation context is extracted
//     from MessageInfo.Headers; the span is its child when the context has
//     no live local span, so one trace runs from the enqueue to the
//     processing, and a link to it in every case (the conventions require
//     the link and allow the parent for a span that covers one message;
//     every process span covers exactly one). When the handling runs under
//     a live local span (an HTTP server span, say), that span stays the
//     parent and the creation context is linked.
//
// A message from a public endpoint (MessageInfo.Untrusted: the webhook
// receivers and httpidem set it unless configured to trust their callers)
// is not a message of a producer you run: its sender chose its headers.
// Its "process" span starts a trace of its own (or stays under the live
// local span of the context, an HTTP server span of yours) and only links
// the sender's trace context, so that the sender picks neither the trace
// nor, through its sampled flag, whether the span is recorded; the sender's
// baggage is not read, so it reaches neither the handler's context nor the
// outbox messages it enqueues. Baggage that your own middleware put in the
// request's context is yours and kept. An otelhttp handler in front of a
// public endpoint should be built with otelhttp.WithPublicEndpointFn, or its
// server span joins the sender's trace before dedupe sees the request.
//
// Attributes: messaging.system, messaging.destination.name,
// messaging.message.id, messaging.consumer.group.name,
// messaging.operation.type and messaging.operation.name,
// messaging.destination.partition.id and messaging.kafka.offset for Kafka,
// error.type on failure, and dedupe.scope, dedupe.mode, dedupe.outcome,
// dedupe.attempt, dedupe.delivery.
//
// # Metrics
//
// See New's documentation for the instruments and their attributes.
package dedupeotel
