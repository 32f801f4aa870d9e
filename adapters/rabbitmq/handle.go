package dedupeamqp

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/dedupe"
)

// handle processes one delivery: claim, handler and commit in one
// transaction, then the broker action its outcome calls for (see the
// package documentation). ctx is the handlers' context (cancelled
// DrainTimeout after a stop); stopping is closed once the run stops.
func (r *Runner) handle(ctx context.Context, stopping <-chan struct{}, d *delivery) {
	if d.sess.isDead() && !d.last {
		return // the broker requeued it with its channel
	}
	// At its last delivery a dead channel made the broker drop it (or
	// dead-letter it): the runner holds its only copy, and handles it.
	if isClosed(stopping) && !d.last {
		r.handBack(ctx, d)
		return
	}
	key, kerr := r.consumer.KeyOf(d.msg)
	d.key = key
	if kerr != nil {
		r.refuse(ctx, stopping, d, kerr)
		return
	}
	hctx := ctx
	if d.last {
		hctx = context.WithValue(ctx, lastDeliveryKey{}, true)
	}
	for try := 1; ; try++ {
		outcome, err := r.consumer.HandleKey(hctx, key, d.msg)
		he, handlerFailed := errors.AsType[*dedupe.HandlerError](err)

		switch {
		case err == nil:
			r.ack(ctx, d)
			return
		case outcome == dedupe.OutcomePoisoned:
			// The key is recorded as failed in the inbox.
			r.deadLetter(ctx, stopping, d, err)
			return
		case outcome == dedupe.OutcomeConflict:
			r.refuse(ctx, stopping, d, err)
			return
		case d.sess.isDead() && !d.last:
			// Nothing to settle: the broker requeued it with its channel.
			return
		case ctx.Err() != nil:
			// Shutting down past DrainTimeout: whatever ran was rolled back
			// (or, if the commit raced the cancel, will be absorbed as a
			// duplicate). Never ack.
			if d.last {
				r.settle(ctx, d, fmt.Errorf("%w: the runner stopped: %w", ErrLastDelivery, err), true)
				return
			}
			r.release(ctx, d, err)
			return
		case handlerFailed && d.last:
			// At the last delivery the failure is permanent; that it is not
			// poisoned means the database could not record it.
			r.settle(ctx, d, err, true)
			return
		case handlerFailed:
			r.requeueLater(ctx, d, err, r.cfg.Backoff(max(he.Attempt, 1)))
			return
		case outcome == dedupe.OutcomeInFlight && !d.last:
			r.requeueLater(ctx, d, err, r.cfg.InFlightDelay)
			return
		case isClosed(stopping) && !d.last:
			r.release(ctx, d, err)
			return
		default:
			// The database failed (or, at the last delivery, a concurrent
			// attempt holds the key): not the message's fault. Hold it and
			// try again rather than spend one of its deliveries. A stop hands
			// it back, except at its last delivery, which is held until
			// DrainTimeout and then settled.
			delay := r.cfg.Backoff(try)
			if outcome == dedupe.OutcomeInFlight {
				delay = r.cfg.InFlightDelay
			}
			r.event(ctx, dedupe.EventRetried, d, err, delay)
			wake := stopping
			if d.last {
				wake = d.sess.dead
			}
			sleep(ctx, wake, delay)
			if d.sess.isDead() {
				if d.last {
					r.lostAtLastDelivery(ctx, d, err)
				}
				return
			}
			if isClosed(stopping) && !d.last {
				r.release(ctx, d, err)
				return
			}
		}
	}
}

// ack acknowledges a delivery whose effects committed (or were committed
// before). An ack that cannot be sent (dedupe.EventAckFailed; its channel
// died) leaves the message to be redelivered, and the inbox absorbs it.
func (r *Runner) ack(ctx context.Context, d *delivery) {
	if err := d.sess.ack(d.tag); err != nil {
		r.event(ctx, dedupe.EventAckFailed, d, err, 0)
	}
}

// handBack releases a delivery the runner did not handle because it is
// stopping (dedupe.EventReleased).
func (r *Runner) handBack(ctx context.Context, d *delivery) {
	if key, err := r.consumer.KeyOf(d.msg); err == nil {
		d.key = key
	}
	if d.last {
		// The broker would not deliver it again: handle it now.
		r.handle(ctx, nil, d)
		return
	}
	r.release(ctx, d, nil)
}

// release hands a delivery that was not processed (cause: why, nil when it
// was never tried) back for redelivery at once.
func (r *Runner) release(ctx context.Context, d *delivery, cause error) {
	r.requeue(ctx, d)
	r.event(ctx, dedupe.EventReleased, d, cause, 0)
}

// lostAtLastDelivery reports a delivery at its last delivery whose channel
// died before the runner could record it: the broker dropped it, or
// dead-lettered it to the queue's dead-letter exchange.
func (r *Runner) lostAtLastDelivery(ctx context.Context, d *delivery, cause error) {
	r.cfg.Logger.ErrorContext(ctx, "dedupeamqp: the channel died with a message at its last delivery; the broker drops it or dead-letters it to the queue's x-dead-letter-exchange",
		"queue", r.queue, "key", d.key.ID, "delivery", d.num, "cause", cause)
}
