package outbox

import (
	"context"
	"time"
)

// Observer is told what the outbox and its relays do, for metrics, traces
// and logs: the outbox's counterpart of dedupe.Observer. Every method takes
// the context of the operation. Methods are called on the hot path: keep
// them fast and never block. Embed NopObserver to implement only some of
// them. A nil Observer (the default) costs nothing.
//
// The dedupeotel module's Observer implements it and dedupe.Observer both.
type Observer interface {
	// Enqueued is called for a message being enqueued in the outbox, before
	// it is written: it may add headers to msg (the trace context), which are
	// stored and published with it.
	Enqueued(ctx context.Context, msg *Message)
	// StartPublish is called when the relay publishes an outbox message; done
	// is called once with the publish's error (nil when the broker
	// confirmed it), whether the failure parked the message, and for a
	// confirmed message the lag from its enqueue to the confirmation,
	// measured by the database.
	StartPublish(ctx context.Context, msg *StoredMessage) (_ context.Context, done func(PublishDone))
	// Discarded reports an outbox message an operator discarded.
	Discarded(ctx context.Context, msg *StoredMessage, by, reason string)
	// OutboxQueued reports the outbox's unpublished messages, every
	// RelayConfig.StatsInterval.
	OutboxQueued(ctx context.Context, s Stats)
}

// PublishDone is what an outbox publish came to.
type PublishDone struct {
	Err    error
	Parked bool
	// Lag is the time from the message's enqueue to the broker's
	// confirmation, on the database's clock (0 for a failed publish).
	Lag time.Duration
}

// NopObserver does nothing; embed it to implement part of Observer.
type NopObserver struct{}

var _ Observer = NopObserver{}

// Enqueued does nothing.
func (NopObserver) Enqueued(context.Context, *Message) {}

// StartPublish returns ctx and a done that does nothing.
func (NopObserver) StartPublish(ctx context.Context, _ *StoredMessage) (context.Context, func(PublishDone)) {
	return ctx, func(PublishDone) {}
}

// Discarded does nothing.
func (NopObserver) Discarded(context.Context, *StoredMessage, string, string) {}

// OutboxQueued does nothing.
func (NopObserver) OutboxQueued(context.Context, Stats) {}

// Observers fans every call out to each of obs, in order; nil entries are
// skipped.
func Observers(obs ...Observer) Observer {
	var out multiObserver
	for _, o := range obs {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

type multiObserver []Observer

func (m multiObserver) Enqueued(ctx context.Context, msg *Message) {
	for _, o := range m {
		o.Enqueued(ctx, msg)
	}
}

func (m multiObserver) StartPublish(ctx context.Context, msg *StoredMessage) (context.Context, func(PublishDone)) {
	dones := make([]func(PublishDone), len(m))
	for n, o := range m {
		ctx, dones[n] = o.StartPublish(ctx, msg)
	}
	return ctx, func(d PublishDone) {
		for n := len(dones) - 1; n >= 0; n-- {
			dones[n](d)
		}
	}
}

func (m multiObserver) Discarded(ctx context.Context, msg *StoredMessage, by, reason string) {
	for _, o := range m {
		o.Discarded(ctx, msg, by, reason)
	}
}

func (m multiObserver) OutboxQueued(ctx context.Context, s Stats) {
	for _, o := range m {
		o.OutboxQueued(ctx, s)
	}
}
