package dedupenats

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// lastDeliveryKey marks the context of a handler running at the last
// delivery the consumer allows.
type lastDeliveryKey struct{}

// lastDeliveryHandler wraps h so that, at the last delivery the consumer
// allows (maxDeliver), its failure or panic is permanent: the core then
// records the key as failed in the same step that counts the attempt, since
// JetStream will not deliver the message again. Attempts spent on shutdowns
// or concurrent copies are not counted by the inbox, so the inbox's attempt
// limit alone may not have been reached yet.
func lastDeliveryHandler(h dedupe.HandlerFunc[jetstream.Msg], maxDeliver int) dedupe.HandlerFunc[jetstream.Msg] {
	if maxDeliver <= 0 {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) (err error) {
		if ctx.Value(lastDeliveryKey{}) == nil {
			return h(ctx, tx, msg)
		}
		defer func() {
			if v := recover(); v != nil {
				err = &dedupe.PanicError{Value: v, Stack: debug.Stack()}
			}
			if err != nil && !dedupe.IsPermanent(err) {
				err = dedupe.Permanent(fmt.Errorf("%w (MaxDeliver %d): %w", ErrLastDelivery, maxDeliver, err))
			}
		}()
		return h(ctx, tx, msg)
	}
}

// settle ends msg at the last delivery the consumer allows, when it could not
// be processed, without letting it lapse: it records the key as failed in the
// inbox (when recordable; a key already complete is acknowledged instead),
// else publishes a copy to Config.DeadLetterSubject, and only then
// terminates the message. When neither works it keeps the message alive (the
// heartbeat still holds it) and tries again with Config.Backoff, for as long
// as it takes.
func (r *Runner) settle(msg jetstream.Msg, ev *Event, cause error, recordable bool) {
	ctx := context.Background()
	for try := 1; ; try++ {
		var err error
		if recordable {
			var done bool
			if done, err = r.recordFailed(ctx, msg, ev, cause); done {
				return
			}
		}
		if r.cfg.DeadLetterSubject != "" {
			derr := r.deadLetter(ctx, msg, ev, cause)
			if derr == nil {
				ev.Err = errors.Join(cause, ErrDeadLettered)
				r.term(msg, ev)
				return
			}
			err = errors.Join(err, fmt.Errorf("dead-letter to %s: %w", r.cfg.DeadLetterSubject, derr))
		}
		d := r.cfg.Backoff(try)
		r.cfg.Logger.Error("dedupenats: message at its last delivery can be neither recorded as failed nor dead-lettered; holding it",
			"scope", r.cfg.Scope, "key", ev.Key.ID, "subject", msg.Subject(), "delivery", ev.Delivery,
			"cause", cause, "err", err, "retry_in", d)
		sleep(ctx, nil, d)
	}
}

// recordFailed records ev.Key as failed with cause. It reports done when
// the message reached a visible end: recorded as failed (terminated), or
// found complete (acknowledged as a duplicate).
func (r *Runner) recordFailed(ctx context.Context, msg jetstream.Msg, ev *Event, cause error) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	_, poisoned, err := r.inbox.RecordFailure(rctx, ev.Key, dedupe.Permanent(cause))
	if err != nil {
		return false, fmt.Errorf("record as failed: %w", err)
	}
	if !poisoned {
		// The key was left alone: it is complete, already failed, or held by
		// a live lease.
		rec, err := r.inbox.Lookup(rctx, ev.Key)
		switch {
		case err != nil:
			return false, fmt.Errorf("look up: %w", err)
		case rec.State == dedupe.StateComplete:
			ev.Kind, ev.Err = KindDuplicate, nil
			r.ack(ctx, msg, ev)
			return true, nil
		case rec.State != dedupe.StateFailed:
			return false, fmt.Errorf("key %s is held by a live lease", ev.Key)
		}
	}
	ev.Err = cause
	r.term(msg, ev)
	return true, nil
}

// reject ends a message that can never be processed: it has no usable key,
// or its key was used with another payload. With Config.DeadLetterSubject it
// is copied there before it is terminated; a failed copy is retried (at the
// last delivery, held and retried until it succeeds). Without it the message
// is terminated and reported to Metrics, which logs it at error level.
func (r *Runner) reject(ctx context.Context, p phase, msg jetstream.Msg, ev *Event, last bool) {
	if r.cfg.DeadLetterSubject == "" {
		r.term(msg, ev)
		return
	}
	if last {
		r.settle(msg, ev, ev.Err, false)
		return
	}
	if err := r.deadLetter(context.WithoutCancel(ctx), msg, ev, ev.Err); err != nil {
		ev.Kind, ev.Delay = KindRetry, r.cfg.Backoff(max(int(ev.Delivery), 1))
		ev.Err = errors.Join(ev.Err, fmt.Errorf("dead-letter to %s: %w", r.cfg.DeadLetterSubject, err))
		r.nak(p, msg, ev)
		return
	}
	ev.Err = errors.Join(ev.Err, ErrDeadLettered)
	r.term(msg, ev)
}
