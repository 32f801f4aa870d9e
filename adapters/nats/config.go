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
	// DefaultMinPending is the least MaxPending defaults to.
	DefaultMinPending = 64
	// DefaultPullExpiry bounds the default Config.PullExpiry.
	DefaultPullExpiry = 5 * time.Second
)

// AckMode is how a Runner acknowledges a message whose effects committed.
type AckMode int

// Modes of Config.AckMode.
const (
	// AckDouble sends DoubleAck and waits up to Config.AckTimeout for the
	// server to confirm it, so that an ack that did not arrive is reported
	// (dedupe.EventAckFailed). The worker waits one round trip per message.
	AckDouble AckMode = iota
	// AckSingle sends Ack and does not wait. An ack lost on the way is not
	// reported: JetStream redelivers the message after AckWait and the inbox
	// acknowledges the copy as a duplicate without running the handler, so
	// the effect still happens once; it only costs that redelivery.
	AckSingle
)

// Config configures a Runner. The zero value is usable.
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
	// Config.MaxAttempts, or to the consumer's MaxDeliver when that is lower;
	// negative means no limit. It must not exceed MaxDeliver. Whatever it
	// is, a handler failure at the last delivery the consumer allows records
	// the key as failed (deliveries spent on shutdowns or in-flight copies
	// are not attempts, so the two counts can differ).
	MaxAttempts int
	// Workers is the number of messages (in batch mode, batches) handled
	// concurrently. Defaults to 4.
	Workers int
	// BatchSize turns on batch mode when above 1: each worker takes up to
	// BatchSize of the messages fetched (the one it waited for and those
	// already buffered), claims their keys with one statement, runs the
	// handler for the new ones in one transaction and commits them with one
	// commit, then acknowledges each. A failing message is isolated: its
	// attempt is recorded, it is handed back with Backoff, and the others
	// commit once (see dedupe.BatchConsumer). Messages at their last
	// delivery (MaxDeliver) and those without a usable key are handled on
	// their own, as in per-message mode. Defaults to 1 (per-message mode:
	// one transaction per message).
	BatchSize int
	// MaxPending bounds the messages fetched ahead of the workers (the pull
	// buffer), so at most Workers×BatchSize+MaxPending messages are in
	// flight in this runner; they count against the consumer's
	// MaxAckPending. A new pull request is sent when half of it is free, so
	// a larger buffer costs fewer pull requests per message. Buffered
	// messages are marked in progress like running ones, so a long wait in
	// the buffer does not exceed AckWait. Defaults to max(2×Workers, 64),
	// and in batch mode to max(Workers×BatchSize, 64).
	MaxPending int
	// PullExpiry is how long one pull request waits for messages. Run waits
	// for the open request to end when it stops, so that no message the
	// server sent is dropped unseen; it bounds that part of a shutdown. It is
	// capped at the consumer's MaxRequestExpires. Defaults to DrainTimeout,
	// at least 1s and at most 5s.
	PullExpiry time.Duration
	// Backoff gives the redelivery delay after the attempt-th failed attempt.
	// Defaults to dedupe.Backoff{Min: 100ms, Max: 30s, Jitter: 0.2}.Delay.
	Backoff func(attempt int) time.Duration
	// InFlightDelay is the redelivery delay when a concurrent attempt holds
	// the key. Defaults to 1s.
	InFlightDelay time.Duration
	// Heartbeat is how often a message the runner holds (buffered, being
	// handled, or held while the database is unreachable) is marked in
	// progress. It must be shorter than the consumer's AckWait. Defaults to a
	// third of AckWait (10s for the default 30s).
	Heartbeat time.Duration
	// AckMode chooses DoubleAck (AckDouble) or Ack (AckSingle) after a
	// commit. Defaults to AckDouble.
	AckMode AckMode
	// AckTimeout bounds a DoubleAck, a dead-letter publish, and one try to
	// record a message as failed at its last delivery. Defaults to 5s.
	AckTimeout time.Duration
	// DeadLetterSubject, when set, receives a copy of each message the runner
	// gives up on without a record in the inbox: at its last delivery while
	// the database cannot record it as failed (a shutdown during an outage),
	// a message without a usable key, and a key reused with another payload.
	// The copy is published with JetStream (a stream must capture the
	// subject) and acknowledged by the stream before the message is
	// terminated; it carries the original headers and data and the
	// Dedupe-* headers (see DeadLetterReasonHeader). Defaults to "" (none).
	DeadLetterSubject string
	// DeadLetterJS publishes to DeadLetterSubject. Defaults to the
	// JetStream given to Open; required with New when DeadLetterSubject is
	// set.
	DeadLetterJS jetstream.JetStream
	// DrainTimeout is how long in-flight handlers may run on after Run's
	// context is cancelled before their transactions are cancelled and
	// rolled back. Defaults to 10s.
	DrainTimeout time.Duration
	// Logger receives the runner's logs: messages terminated (at error
	// level), retried, not acknowledged (warn), released (debug). Defaults
	// to the inbox's logger. For metrics and traces, set the inbox's
	// Observer: it is told of every handling and of what the runner did
	// beyond it (dedupe.TransportEvent).
	Logger *slog.Logger

	maxDeliver int // the consumer's MaxDeliver, -1 for no limit
	maxBatch   int // the consumer's MaxRequestBatch, 0 for no limit
}

// withDefaults fills the zero fields of a copy of c for consumer info ci
// and validates it.
func (c Config) withDefaults(inbox *dedupe.Inbox, ci *jetstream.ConsumerInfo) (Config, error) {
	out := c
	ackWait := DefaultAckWait
	maxDeliver := -1
	var maxBatch int
	var maxExpires time.Duration
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
		maxBatch, maxExpires = ci.Config.MaxRequestBatch, ci.Config.MaxRequestExpires
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
	if out.BatchSize == 0 {
		out.BatchSize = 1
	}
	if out.MaxPending == 0 {
		out.MaxPending = max(2*out.Workers, DefaultMinPending)
		if out.BatchSize > 1 {
			out.MaxPending = max(out.Workers*out.BatchSize, DefaultMinPending)
		}
	}
	if out.Backoff == nil {
		out.Backoff = dedupe.Backoff{Min: DefaultBackoffBase, Max: DefaultBackoffMax, Jitter: 0.2}.Delay
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
	if out.PullExpiry == 0 {
		out.PullExpiry = min(max(out.DrainTimeout, time.Second), DefaultPullExpiry)
	}
	if maxExpires > 0 {
		out.PullExpiry = min(out.PullExpiry, maxExpires)
	}
	if out.Logger == nil {
		out.Logger = inbox.Config().Logger
	}
	bad := func(field, reason string) (Config, error) {
		return out, &dedupe.ConfigError{Field: field, Reason: reason}
	}
	switch {
	case out.Scope == "":
		return bad("Scope", "is required when the consumer has no name")
	case out.Workers < 0:
		return bad("Workers", "must be positive")
	case out.BatchSize < 0:
		return bad("BatchSize", "must be positive")
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
	case out.PullExpiry < 0:
		return bad("PullExpiry", "must be positive")
	case out.AckMode != AckDouble && out.AckMode != AckSingle:
		return bad("AckMode", "must be AckDouble or AckSingle")
	case out.DeadLetterSubject != "" && out.DeadLetterJS == nil:
		return bad("DeadLetterJS", "is required with DeadLetterSubject")
	}
	out.maxDeliver, out.maxBatch = maxDeliver, maxBatch
	return out, nil
}
