package dedupenats

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// Defaults of Config.
const (
	DefaultWorkers      = 4
	DefaultAckTimeout   = 5 * time.Second
	DefaultDrainTimeout = 10 * time.Second
	// DefaultAckWait is assumed when the consumer's info does not say.
	DefaultAckWait = 30 * time.Second
)

// Config configures a Runner. The zero value (or nil) is usable.
type Config struct {
	// Scope is the namespace of the keys in the inbox. Defaults to the
	// consumer's durable name (its name for an ephemeral consumer).
	Scope string
	// Key extracts a message's dedup key. Defaults to DefaultKey (the
	// Nats-Msg-Id header, else stream name and stream sequence).
	Key func(msg jetstream.Msg) (string, error)
	// Fingerprint optionally hashes the payload; a redelivery under the same
	// key with another fingerprint is terminated as a conflict. Defaults to
	// none.
	Fingerprint func(msg jetstream.Msg) []byte
	// IsoLevel is the transaction's isolation level. Defaults to the
	// database default (read committed).
	IsoLevel pgx.TxIsoLevel
	// LockTimeout bounds how long a worker waits for a concurrent
	// transaction holding the same key before it naks the message as in
	// flight. Defaults to 0 (wait; the other attempt commits or rolls back
	// soon).
	LockTimeout time.Duration
	// MaxAttempts is how many failed attempts a message gets before it is
	// poison, terminated and recorded as failed. Defaults to the inbox's
	// Config.MaxAttempts, or to the consumer's MaxDeliver when that is lower
	// (so the last delivery JetStream makes is the one that records the
	// failure); negative means no limit. It must not exceed MaxDeliver.
	MaxAttempts int
	// Workers is the number of messages handled concurrently. Defaults to 4.
	Workers int
	// MaxPending bounds the messages fetched ahead of the workers (the pull
	// buffer), so at most Workers+MaxPending messages are in flight in this
	// runner. Defaults to Workers.
	MaxPending int
	// Backoff gives the redelivery delay after the attempt-th failed attempt.
	// Defaults to ExponentialBackoff(100ms, 30s).
	Backoff func(attempt int) time.Duration
	// InFlightDelay is the redelivery delay when a concurrent attempt holds
	// the key. Defaults to 1s.
	InFlightDelay time.Duration
	// Heartbeat is how often a running handler's message is marked in
	// progress. It must be shorter than the consumer's AckWait. Defaults to a
	// third of AckWait (10s for the default 30s).
	Heartbeat time.Duration
	// AckTimeout bounds a DoubleAck. Defaults to 5s.
	AckTimeout time.Duration
	// DrainTimeout is how long in-flight handlers may run on after Run's
	// context is cancelled before their transactions are cancelled and
	// rolled back. Defaults to 10s.
	DrainTimeout time.Duration
	// Metrics receives an Event per message. Defaults to LogMetrics with
	// Logger.
	Metrics Metrics
	// Logger receives the runner's logs. Defaults to the inbox's logger.
	Logger *slog.Logger
}

// withDefaults fills the zero fields of a copy of c for consumer info ci
// and validates it.
func (c *Config) withDefaults(inbox *dedupe.Inbox, ci *jetstream.ConsumerInfo) (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	ackWait := DefaultAckWait
	maxDeliver := -1
	if ci != nil {
		if ci.Config.AckPolicy != jetstream.AckExplicitPolicy {
			// AckAll would acknowledge messages other workers have not
			// committed yet; AckNone loses every message that fails.
			return out, &dedupe.ConfigError{Field: "consumer", Reason: "AckPolicy must be AckExplicitPolicy, not " + ci.Config.AckPolicy.String()}
		}
		if ci.Config.MaxDeliver > 0 {
			maxDeliver = ci.Config.MaxDeliver
		}
		if ci.Config.AckWait > 0 {
			ackWait = ci.Config.AckWait
		}
		if out.Scope == "" {
			out.Scope = ci.Config.Durable
		}
		if out.Scope == "" {
			out.Scope = ci.Name
		}
	}
	if maxDeliver > 0 {
		inboxMax := inbox.Config().MaxAttempts
		switch {
		case out.MaxAttempts == 0 && (inboxMax < 0 || inboxMax > maxDeliver):
			out.MaxAttempts = maxDeliver
		case out.MaxAttempts < 0 || out.MaxAttempts > maxDeliver:
			return out, &dedupe.ConfigError{Field: "MaxAttempts", Reason: fmt.Sprintf(
				"must not exceed the consumer's MaxDeliver (%d): JetStream would stop delivering before the key is marked failed", maxDeliver)}
		}
	}
	if out.Key == nil {
		out.Key = DefaultKey
	}
	if out.Workers == 0 {
		out.Workers = DefaultWorkers
	}
	if out.MaxPending == 0 {
		out.MaxPending = out.Workers
	}
	if out.Backoff == nil {
		out.Backoff = ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax)
	}
	if out.InFlightDelay == 0 {
		out.InFlightDelay = DefaultInFlightDelay
	}
	if out.Heartbeat == 0 {
		out.Heartbeat = ackWait / 3
	}
	if out.AckTimeout == 0 {
		out.AckTimeout = DefaultAckTimeout
	}
	if out.DrainTimeout == 0 {
		out.DrainTimeout = DefaultDrainTimeout
	}
	if out.Logger == nil {
		out.Logger = inbox.Config().Logger
	}
	if out.Metrics == nil {
		out.Metrics = LogMetrics{Logger: out.Logger}
	}
	bad := func(field, reason string) (Config, error) {
		return out, &dedupe.ConfigError{Field: field, Reason: reason}
	}
	switch {
	case out.Scope == "":
		return bad("Scope", "is required when the consumer has no name")
	case out.Workers < 0:
		return bad("Workers", "must be positive")
	case out.MaxPending < 0:
		return bad("MaxPending", "must be positive")
	case out.InFlightDelay < 0:
		return bad("InFlightDelay", "must be positive")
	case out.Heartbeat < 0 || out.Heartbeat >= ackWait:
		return bad("Heartbeat", "must be positive and shorter than the consumer's AckWait ("+ackWait.String()+")")
	case out.AckTimeout < 0:
		return bad("AckTimeout", "must be positive")
	case out.DrainTimeout < 0:
		return bad("DrainTimeout", "must be positive")
	case out.LockTimeout < 0:
		return bad("LockTimeout", "must not be negative")
	}
	return out, nil
}
