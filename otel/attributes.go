package dedupeotel

import (
	"go.opentelemetry.io/otel/attribute"
)

// The attributes dedupe adds to the messaging conventions' own.
const (
	// ScopeKey is the key's scope (ConsumerConfig.Scope).
	ScopeKey = attribute.Key("dedupe.scope")
	// ModeKey is how the message was handled: "transactional" (Consumer),
	// "batch" (BatchConsumer) or "leased" (Inbox.Begin).
	ModeKey = attribute.Key("dedupe.mode")
	// OutcomeKey is what a handling came to (dedupe.Outcome's name:
	// "claimed", "duplicate", "in_flight", "conflict", "poisoned", "retry",
	// "unknown", or "error" when Handle failed before any outcome) or what
	// a publish came to ("published", "failed", "parked").
	OutcomeKey = attribute.Key("dedupe.outcome")
	// AttemptKey is the attempt number of the claim, or of the publish.
	AttemptKey = attribute.Key("dedupe.attempt")
	// DeliveryKey is the broker's delivery count, when the transport knows it.
	DeliveryKey = attribute.Key("dedupe.delivery")
	// ResultKey is "ok" or "error" for lease renewals and purges.
	ResultKey = attribute.Key("dedupe.result")
	// EventKey names a transport event (dedupe.TransportEvent.Name).
	EventKey = attribute.Key("dedupe.event")
	// StateKey is a key's state in the inbox: "in_flight", "complete",
	// "failed".
	StateKey = attribute.Key("dedupe.state")
	// OutboxTableKey is the outbox table of the outbox gauges read by
	// ObserveStats.
	OutboxTableKey = attribute.Key("dedupe.outbox.table")
)

// Publish outcomes, the values of OutcomeKey on send spans and on the
// dedupe.outbox.publishes counter.
const (
	PublishPublished = "published"
	PublishFailed    = "failed"
	PublishParked    = "parked"
)

// OutcomeError is the value of OutcomeKey for a handling that failed before
// it came to an outcome (a database error, a key that could not be
// extracted).
const OutcomeError = "error"
