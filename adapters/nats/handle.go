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
// recorded as failed or dead-lettered).
//
// It returns the outcome of the message's last handling (0 when it had none:
// no usable key, or the database failed) and nil when the message was
// acknowledged, processed now or before. Otherwise the error says why not:
// the acknowledgement's error (with OutcomeClaimed or OutcomeDuplicate), or
// the handling's, or the reason the message was given up on (matching
// ErrDeadLettered when a copy went to Config.DeadLetterSubject). The inbox's
// Observer is told of the handling and of what the runner did beyond it
// (dedupe.TransportEvent).
func (r *Runner) Handle(ctx context.Context, msg jetstream.Msg) (dedupe.Outcome, error) {
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
func (r *Runner) handle(ctx context.Context, p phase, msg jetstream.Msg) (dedupe.Outcome, error) {
	dv := newDelivery(msg)
	d := &dv
	last := r.cfg.maxDeliver > 0 && d.num >= uint64(r.cfg.maxDeliver)
	key, kerr := r.consumer.KeyOf(msg)
	d.key = key
	if kerr != nil {
		return 0, r.reject(ctx, p, d, kerr, last)
	}
	hctx := ctx
	if last {
		hctx = context.WithValue(ctx, lastDeliveryKey{}, true)
	}
	for try := 1; ; try++ {
		outcome, err := r.consumer.HandleKey(hctx, key, msg)
		he, handlerFailed := errors.AsType[*dedupe.HandlerError](err)

		switch {
		case err == nil:
			return outcome, r.ack(ctx, d)
		case outcome == dedupe.OutcomePoisoned:
			// The key is recorded as failed in the inbox.
			r.term(ctx, d, err)
			return outcome, err
		case outcome == dedupe.OutcomeConflict:
			return outcome, r.reject(ctx, p, d, err, last)
		case ctx.Err() != nil:
			// Shutting down past DrainTimeout: whatever ran was rolled back
			// (or, if the commit raced the cancel, will be absorbed as a
			// duplicate). Never ack.
			if last {
				return settled(outcome)(r.settle(ctx, d, fmt.Errorf("%w: the runner stopped: %w", ErrLastDelivery, err), true))
			}
			r.release(ctx, p, d, err)
			return outcome, err
		case handlerFailed && last:
			// At the last delivery the failure is permanent; that it is not
			// poisoned means the database could not record it.
			return settled(outcome)(r.settle(ctx, d, err, true))
		case handlerFailed:
			r.nak(ctx, p, d, err, r.cfg.Backoff(max(he.Attempt, 1)))
			return outcome, err
		case outcome == dedupe.OutcomeInFlight && !last:
			r.nak(ctx, p, d, err, r.cfg.InFlightDelay)
			return outcome, err
		case isClosed(p.stopping) && !last:
			r.release(ctx, p, d, err)
			return outcome, err
		default:
			// The database failed (or, at the last delivery, a concurrent
			// attempt holds the key): not the message's fault. Hold it, kept
			// alive by the heartbeat, and try again, rather than spend one of
			// its deliveries. A stop hands it back, except at its last
			// delivery, which is held until DrainTimeout and then settled.
			delay := r.cfg.Backoff(try)
			if outcome == dedupe.OutcomeInFlight {
				delay = r.cfg.InFlightDelay
			}
			r.event(ctx, dedupe.EventRetried, d, err, delay)
			wake := p.stopping
			if last {
				wake = nil
			}
			sleep(ctx, wake, delay)
			if isClosed(p.stopping) && !last {
				r.release(ctx, p, d, err)
				return outcome, err
			}
			continue
		}
	}
}

// ack acknowledges a message whose effects committed (or were committed
// before), as Config.AckMode says, and returns the acknowledgement's error.
func (r *Runner) ack(ctx context.Context, d *delivery) error {
	r.beat.let(d.msg)
	var err error
	if r.cfg.AckMode == AckSingle {
		err = d.msg.Ack()
	} else {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout)
		err = d.msg.DoubleAck(actx)
		cancel()
	}
	if err != nil {
		r.event(ctx, dedupe.EventAckFailed, d, err, 0)
	}
	return err
}

// release hands a message that was not handled (cause: why, nil when it
// was never tried) back for redelivery at once.
func (r *Runner) release(ctx context.Context, p phase, d *delivery, cause error) {
	p.waitPulled()
	r.beat.let(d.msg)
	if err := d.msg.Nak(); err != nil {
		r.cfg.Logger.DebugContext(ctx, "dedupenats: nak on shutdown", "subject", d.msg.Subject(), "err", err)
	}
	r.event(ctx, dedupe.EventReleased, d, cause, 0)
}

// nak hands a message back to be delivered again after delay, because of
// cause.
func (r *Runner) nak(ctx context.Context, p phase, d *delivery, cause error, delay time.Duration) {
	p.waitPulled()
	r.beat.let(d.msg)
	if err := d.msg.NakWithDelay(delay); err != nil {
		r.cfg.Logger.WarnContext(ctx, "dedupenats: nak", "subject", d.msg.Subject(), "key", d.key.ID, "err", err)
	}
	r.event(ctx, dedupe.EventRetried, d, cause, delay)
}

// maxReason bounds the reason sent with Term.
const maxReason = 200

// term terminates a message the runner gives up on because of cause, once
// it is visible elsewhere (its key failed, a dead-letter copy).
func (r *Runner) term(ctx context.Context, d *delivery, cause error) {
	reason := "dedupe: terminated"
	if cause != nil {
		reason = cause.Error()
	}
	r.beat.let(d.msg)
	if err := d.msg.TermWithReason(truncate(reason)); err != nil {
		r.cfg.Logger.WarnContext(ctx, "dedupenats: term", "subject", d.msg.Subject(), "key", d.key.ID, "err", err)
	}
	r.event(ctx, dedupe.EventTerminated, d, cause, 0)
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

// settled returns what Handle reports for a message settled at its last
// delivery: the outcome settling found, else the last handling's.
func settled(last dedupe.Outcome) func(dedupe.Outcome, error) (dedupe.Outcome, error) {
	return func(o dedupe.Outcome, err error) (dedupe.Outcome, error) {
		if o == 0 {
			o = last
		}
		return o, err
	}
}
