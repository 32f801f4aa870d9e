package dedupenats

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/dedupe"
)

// Kind is what became of one delivered message.
type Kind int

// Kinds of Event.
const (
	// KindProcessed: the handler ran, its effects committed, the message was
	// acknowledged.
	KindProcessed Kind = iota + 1
	// KindDuplicate: the key was already complete; the message was
	// acknowledged without running the handler.
	KindDuplicate
	// KindRetry: the handler failed; everything rolled back and the message
	// was negatively acknowledged with Delay. Or the database failed: the
	// message is held, marked in progress, and tried again after Delay.
	KindRetry
	// KindInFlight: a concurrent attempt held the key; the message was
	// negatively acknowledged with Config.InFlightDelay.
	KindInFlight
	// KindTerminated: the message can never be processed (poison, conflict,
	// no key, or given up on at its last delivery) and was terminated after
	// its key was recorded as failed or, when Err matches ErrDeadLettered, a
	// copy was published to the dead-letter subject.
	KindTerminated
	// KindReleased: the runner was shutting down; the attempt rolled back and
	// the message was handed back for immediate redelivery.
	KindReleased
	// KindAckFailed: the effects committed but the acknowledgement failed;
	// the redelivery will be absorbed as a duplicate.
	KindAckFailed
)

var kindNames = [...]string{"", "processed", "duplicate", "retry", "in_flight", "terminated", "released", "ack_failed"}

// String returns the kind's lower-case name.
func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Event describes one delivered message after the runner acted on it.
type Event struct {
	Kind Kind
	// Key is the message's key (zero when it had none).
	Key dedupe.Key
	// Subject is the message's subject.
	Subject string
	// Outcome is what dedupe.Consumer.Handle reported (0 when it did not run
	// or failed before a claim).
	Outcome dedupe.Outcome
	// Delivery is the JetStream delivery count, starting at 1.
	Delivery uint64
	// Delay is the redelivery delay requested by a negative acknowledgement.
	Delay time.Duration
	// Latency is the time spent in the transaction: claim, handler, commit.
	Latency time.Duration
	// Err is why the message was not processed, or the ack error.
	Err error
}

// Metrics receives one Event per delivered message (and one KindRetry event
// per failed try while the database is unreachable). Implementations must be
// safe for concurrent use and fast: Observe runs on the worker.
type Metrics interface {
	Observe(ctx context.Context, e Event)
}

// MetricsFunc adapts a function to Metrics.
type MetricsFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f MetricsFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// LogMetrics is the default Metrics: it logs processed messages and
// duplicates at debug level, retries at warn and terminations at error.
type LogMetrics struct {
	Logger *slog.Logger // Defaults to slog.Default().
}

// Observe logs e.
func (m LogMetrics) Observe(ctx context.Context, e Event) {
	l := m.Logger
	if l == nil {
		l = slog.Default()
	}
	level := slog.LevelDebug
	switch e.Kind {
	case KindRetry, KindInFlight, KindAckFailed:
		level = slog.LevelWarn
	case KindTerminated:
		level = slog.LevelError
	}
	if !l.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("kind", e.Kind.String()),
		slog.String("scope", e.Key.Scope),
		slog.String("key", e.Key.ID),
		slog.String("subject", e.Subject),
		slog.Uint64("delivery", e.Delivery),
		slog.Duration("latency", e.Latency),
	}
	if e.Delay > 0 {
		attrs = append(attrs, slog.Duration("delay", e.Delay))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.Any("err", e.Err))
	}
	l.LogAttrs(ctx, level, "dedupenats: message "+e.Kind.String(), attrs...)
}

// Counters counts events by kind and sums handler latency; read its fields
// at any time. The zero value is ready to use.
type Counters struct {
	Processed, Duplicates, Retries, InFlight, Terminated, Released, AckFailed atomic.Int64
	// LatencyNanos sums Event.Latency over processed messages.
	LatencyNanos atomic.Int64
}

// Observe counts e.
func (c *Counters) Observe(_ context.Context, e Event) {
	switch e.Kind {
	case KindProcessed:
		c.Processed.Add(1)
		c.LatencyNanos.Add(int64(e.Latency))
	case KindDuplicate:
		c.Duplicates.Add(1)
	case KindRetry:
		c.Retries.Add(1)
	case KindInFlight:
		c.InFlight.Add(1)
	case KindTerminated:
		c.Terminated.Add(1)
	case KindReleased:
		c.Released.Add(1)
	case KindAckFailed:
		c.AckFailed.Add(1)
	}
}

// Tee returns Metrics that passes every event to each of ms in turn.
func Tee(ms ...Metrics) Metrics {
	return MetricsFunc(func(ctx context.Context, e Event) {
		for _, m := range ms {
			m.Observe(ctx, e)
		}
	})
}
