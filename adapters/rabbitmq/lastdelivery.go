package dedupeamqp

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
)

// lastDeliveryKey marks the context of a handler running at the last
// delivery the queue allows.
type lastDeliveryKey struct{}

// lastDeliveryHandler wraps h so that, at the last delivery the queue allows
// (x-delivery-count ≥ limit), its failure or panic is permanent: the core
// then records the key as failed in the same step that counts the attempt,
// since the broker will not deliver the message again. Deliveries spent on
// shutdowns, retries' requeues of concurrent copies or dead channels are not
// attempts in the inbox, so its attempt limit alone may not be reached yet.
func lastDeliveryHandler[TTx any](h dedupe.TxHandlerFunc[TTx, amqp.Delivery], limit int) dedupe.TxHandlerFunc[TTx, amqp.Delivery] {
	if limit <= 0 {
		return h
	}
	return func(ctx context.Context, tx TTx, d amqp.Delivery) (err error) {
		if ctx.Value(lastDeliveryKey{}) == nil {
			return h(ctx, tx, d)
		}
		defer func() {
			if v := recover(); v != nil {
				err = &dedupe.PanicError{Value: v, Stack: debug.Stack()}
			}
			if err != nil && !dedupe.IsPermanent(err) {
				err = dedupe.Permanent(fmt.Errorf("%w (x-delivery-limit %d): %w", ErrLastDelivery, limit, err))
			}
		}()
		return h(ctx, tx, d)
	}
}

// settle ends a delivery at the last delivery the queue allows, when it
// could not be processed, without letting the broker drop it: it records
// the key as failed in the inbox (when recordable; a key already complete is
// acknowledged instead) and dead-letters it, or, when the database cannot
// record it, publishes a copy to Config.DeadLetterExchange and acks it.
// When neither works it holds the delivery and tries again with
// Config.Backoff for as long as its channel lives.
func (r *Runner) settle(ctx context.Context, d *delivery, cause error, recordable bool) {
	ctx = context.WithoutCancel(ctx)
	for try := 1; ; try++ {
		var err error
		if recordable {
			var done bool
			if done, err = r.recordFailed(ctx, d, cause); done {
				return
			}
		}
		if r.cfg.DeadLetterExchange != "" {
			derr := r.publishCopy(ctx, d, cause)
			if derr == nil {
				r.event(ctx, dedupe.EventDeadLettered, d, cause, 0)
				r.ack(ctx, d)
				r.event(ctx, dedupe.EventTerminated, d, errors.Join(cause, ErrDeadLettered), 0)
				return
			}
			r.event(ctx, dedupe.EventDeadLetterFailed, d, derr, 0)
			err = errors.Join(err, derr)
		}
		if d.sess.isDead() {
			r.lostAtLastDelivery(ctx, d, errors.Join(cause, err))
			return
		}
		delay := r.cfg.Backoff(try)
		r.cfg.Logger.ErrorContext(ctx, "dedupeamqp: message at its last delivery can be neither recorded as failed nor dead-lettered; holding it",
			"scope", r.cfg.Scope, "key", d.key.ID, "queue", r.queue, "delivery", d.num,
			"cause", cause, "err", err, "retry_in", delay)
		sleep(ctx, d.sess.dead, delay)
	}
}

// recordFailed records the delivery's key as failed with cause and
// dead-letters it. It reports done when the message reached a visible end:
// recorded as failed (then dead-lettered), or found complete (acknowledged
// as a duplicate).
func (r *Runner) recordFailed(ctx context.Context, d *delivery, cause error) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	_, poisoned, err := r.inbox.RecordFailure(rctx, d.key, dedupe.Permanent(cause))
	if err != nil {
		return false, fmt.Errorf("record as failed: %w", err)
	}
	if !poisoned {
		// The key was left alone: it is complete, already failed, or held by
		// a live lease.
		rec, err := r.inbox.Lookup(rctx, d.key)
		switch {
		case err != nil:
			return false, fmt.Errorf("look up: %w", err)
		case rec.State == dedupe.StateComplete:
			// A copy committed meanwhile: this one is its duplicate. Handling
			// it again finds the key complete without running the handler and
			// reports it to the Observer as the duplicate it is.
			if o, herr := r.consumer.HandleKey(rctx, d.key, d.msg); herr == nil && o != dedupe.OutcomeDuplicate {
				r.cfg.Logger.WarnContext(ctx, "dedupeamqp: a key found complete was handled again (purged meanwhile?)",
					"scope", r.cfg.Scope, "key", d.key.ID, "outcome", o)
			}
			r.ack(ctx, d)
			return true, nil
		case rec.State != dedupe.StateFailed:
			return false, fmt.Errorf("key %s is held by a live lease", d.key)
		}
	}
	r.deadLetter(ctx, nil, d, cause)
	return true, nil
}
