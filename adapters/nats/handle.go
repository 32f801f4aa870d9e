package dedupenats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// Handle processes one message: claim, handler and commit in one
// transaction, then the broker action its outcome calls for (see the package
// documentation). Run calls it for every message; call it yourself only when
// you fetch messages yourself. The message is marked in progress while
// Handle has it, and cancelling ctx is treated as a shutdown (see Run; like
// Run, Handle does not return before a message at its last delivery is
// recorded as failed or dead-lettered). The Event it returns was also passed
// to Config.Metrics (with any KindRetry events of database failures it
// waited out before).
func (r *Runner) Handle(ctx context.Context, msg jetstream.Msg) Event {
	r.beat.hold(msg)
	return r.handle(ctx, phase{stopping: ctx.Done()}, msg)
}

// phase tells a message's handling where its Run is.
type phase struct {
	stopping <-chan struct{} // closed once the run stops
	pulled   <-chan struct{} // closed once its last pull request ended; nil outside Run
}

// waitPulled waits, once the run is stopping, until its last pull request
// has ended: a message handed back before that would be delivered again
// into that very request, spending a delivery for nothing.
func (p phase) waitPulled() {
	if p.pulled != nil && isClosed(p.stopping) {
		<-p.pulled
	}
}

// handle is Handle for a message already held by the heartbeat, with ctx
// the handlers' context (cancelled DrainTimeout after a stop).
func (r *Runner) handle(ctx context.Context, p phase, msg jetstream.Msg) Event {
	ev := Event{Subject: msg.Subject()}
	if meta, err := msg.Metadata(); err == nil {
		ev.Delivery = meta.NumDelivered
	}
	last := r.cfg.maxDeliver > 0 && ev.Delivery >= uint64(r.cfg.maxDeliver)
	key, kerr := r.consumer.KeyOf(msg)
	ev.Key = key
	if kerr != nil {
		ev.Err = kerr
		r.reject(ctx, p, msg, &ev, last)
		r.cfg.Metrics.Observe(ctx, ev)
		return ev
	}
	hctx := ctx
	if last {
		hctx = context.WithValue(ctx, lastDeliveryKey{}, true)
	}
	for try := 1; ; try++ {
		start := time.Now()
		outcome, err := r.consumer.HandleKey(hctx, key, msg)
		ev.Latency = time.Since(start)
		ev.Outcome, ev.Err, ev.Delay = outcome, err, 0
		he, handlerFailed := errors.AsType[*dedupe.HandlerError](err)

		switch {
		case err == nil:
			ev.Kind = KindProcessed
			if outcome == dedupe.OutcomeDuplicate {
				ev.Kind = KindDuplicate
			}
			r.ack(ctx, msg, &ev)
		case outcome == dedupe.OutcomePoisoned:
			// The key is recorded as failed in the inbox.
			r.term(msg, &ev)
		case outcome == dedupe.OutcomeConflict:
			r.reject(ctx, p, msg, &ev, last)
		case ctx.Err() != nil:
			// Shutting down past DrainTimeout: whatever ran was rolled back
			// (or, if the commit raced the cancel, will be absorbed as a
			// duplicate). Never ack.
			if last {
				r.settle(msg, &ev, fmt.Errorf("%w: the runner stopped: %w", ErrLastDelivery, err), true)
			} else {
				ev.Kind = KindReleased
				r.release(p, msg)
			}
		case handlerFailed && last:
			// At the last delivery the failure is permanent; that it is not
			// poisoned means the database could not record it.
			r.settle(msg, &ev, err, true)
		case handlerFailed:
			ev.Kind, ev.Delay = KindRetry, r.cfg.Backoff(max(he.Attempt, 1))
			r.nak(p, msg, &ev)
		case outcome == dedupe.OutcomeInFlight && !last:
			ev.Kind, ev.Delay = KindInFlight, r.cfg.InFlightDelay
			r.nak(p, msg, &ev)
		case isClosed(p.stopping) && !last:
			ev.Kind = KindReleased
			r.release(p, msg)
		default:
			// The database failed (or, at the last delivery, a concurrent
			// attempt holds the key): not the message's fault. Hold it, kept
			// alive by the heartbeat, and try again, rather than spend one of
			// its deliveries. A stop hands it back, except at its last
			// delivery, which is held until DrainTimeout and then settled.
			ev.Kind, ev.Delay = KindRetry, r.cfg.Backoff(try)
			if outcome == dedupe.OutcomeInFlight {
				ev.Kind, ev.Delay = KindInFlight, r.cfg.InFlightDelay
			}
			r.cfg.Metrics.Observe(ctx, ev)
			wake := p.stopping
			if last {
				wake = nil
			}
			sleep(ctx, wake, ev.Delay)
			if isClosed(p.stopping) && !last {
				ev.Kind, ev.Delay = KindReleased, 0
				r.release(p, msg)
				r.cfg.Metrics.Observe(ctx, ev)
				return ev
			}
			continue
		}
		r.cfg.Metrics.Observe(ctx, ev)
		return ev
	}
}

// ack acknowledges a message whose effects committed (or were committed
// before), as Config.AckMode says.
func (r *Runner) ack(ctx context.Context, msg jetstream.Msg, ev *Event) {
	r.beat.let(msg)
	var err error
	if r.cfg.AckMode == AckSingle {
		err = msg.Ack()
	} else {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout)
		err = msg.DoubleAck(actx)
		cancel()
	}
	if err != nil {
		ev.Kind, ev.Err = KindAckFailed, err
	}
}

// release hands a message that was not handled back for redelivery at once.
func (r *Runner) release(p phase, msg jetstream.Msg) {
	p.waitPulled()
	r.beat.let(msg)
	if err := msg.Nak(); err != nil {
		r.cfg.Logger.Debug("dedupenats: nak on shutdown", "subject", msg.Subject(), "err", err)
	}
}

func (r *Runner) nak(p phase, msg jetstream.Msg, ev *Event) {
	p.waitPulled()
	r.beat.let(msg)
	if err := msg.NakWithDelay(ev.Delay); err != nil {
		r.cfg.Logger.Warn("dedupenats: nak", "subject", msg.Subject(), "key", ev.Key.ID, "err", err)
	}
}

// maxReason bounds the reason sent with Term.
const maxReason = 200

func (r *Runner) term(msg jetstream.Msg, ev *Event) {
	ev.Kind = KindTerminated
	reason := "dedupe: terminated"
	if ev.Err != nil {
		reason = ev.Err.Error()
	}
	r.beat.let(msg)
	if err := msg.TermWithReason(truncate(reason)); err != nil {
		r.cfg.Logger.Warn("dedupenats: term", "subject", msg.Subject(), "key", ev.Key.ID, "err", err)
	}
}

// sleep waits d, or less when ctx is done or wake is closed.
func sleep(ctx context.Context, wake <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-wake:
	}
}

// isClosed reports whether ch is closed (a nil channel never is).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
