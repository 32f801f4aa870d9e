package dedupenats

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

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
func lastDeliveryHandler[TTx any](h dedupe.TxHandlerFunc[TTx, jetstream.Msg], maxDeliver int) dedupe.TxHandlerFunc[TTx, jetstream.Msg] {
	if maxDeliver <= 0 {
		return h
	}
	return func(ctx context.Context, tx TTx, msg jetstream.Msg) (err error) {
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

// settle ends a message at the last delivery the consumer allows, when it
// could not be processed, without letting it lapse: it records the key as
// failed in the inbox (when recordable; a key already complete is
// acknowledged instead), else publishes a copy to Config.DeadLetterSubject,
// and only then terminates the message. When neither works it keeps the
// message alive (the heartbeat still holds it) and tries again with
// Config.Backoff, for as long as it takes. It returns what Handle does: the
// message's outcome when settling it found one (OutcomeDuplicate: the key
// was complete, the message acknowledged as a duplicate; else 0), and nil
// for a message acknowledged, else why it was given up on.
func (r *Runner) settle(ctx context.Context, d *delivery, cause error, recordable bool) (dedupe.Outcome, error) {
	ctx = context.WithoutCancel(ctx)
	for try := 1; ; try++ {
		var err error
		if recordable {
			var (
				done bool
				o    dedupe.Outcome
				res  error
			)
			if done, o, res, err = r.recordFailed(ctx, d, cause); done {
				return o, res
			}
		}
		if r.cfg.DeadLetterSubject != "" {
			res, derr := r.deadLetterTerm(ctx, d, cause)
			if derr == nil {
				return 0, res
			}
			err = errors.Join(err, derr)
		}
		delay := r.cfg.Backoff(try)
		r.cfg.Logger.ErrorContext(ctx, "dedupenats: message at its last delivery can be neither recorded as failed nor dead-lettered; holding it",
			"scope", r.cfg.Scope, "key", d.key.ID, "subject", d.msg.Subject(), "delivery", d.num,
			"cause", cause, "err", err, "retry_in", delay)
		sleep(ctx, nil, delay)
	}
}

// deadLetterTerm publishes a copy of a message given up on because of cause
// to Config.DeadLetterSubject and terminates it. It returns the cause
// joined with ErrDeadLettered, or the publish's error (then the message is
// left alone).
func (r *Runner) deadLetterTerm(ctx context.Context, d *delivery, cause error) (res, err error) {
	if err := r.deadLetter(ctx, d, cause); err != nil {
		derr := fmt.Errorf("dead-letter to %s: %w", r.cfg.DeadLetterSubject, err)
		r.event(ctx, dedupe.EventDeadLetterFailed, d, derr, 0)
		return nil, derr
	}
	r.event(ctx, dedupe.EventDeadLettered, d, cause, 0)
	res = errors.Join(cause, ErrDeadLettered)
	r.term(ctx, d, res)
	return res, nil
}

// recordFailed records the message's key as failed with cause. It reports
// done when the message reached a visible end, with what Handle returns:
// recorded as failed (terminated; the cause), or found complete
// (acknowledged as a duplicate, OutcomeDuplicate; the ack's error).
func (r *Runner) recordFailed(ctx context.Context, d *delivery, cause error) (done bool, o dedupe.Outcome, res, err error) {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	_, poisoned, err := r.inbox.RecordFailure(rctx, d.key, dedupe.Permanent(cause))
	if err != nil {
		return false, 0, nil, fmt.Errorf("record as failed: %w", err)
	}
	if !poisoned {
		// The key was left alone: it is complete, already failed, or held by
		// a live lease.
		rec, err := r.inbox.Lookup(rctx, d.key)
		switch {
		case err != nil:
			return false, 0, nil, fmt.Errorf("look up: %w", err)
		case rec.State == dedupe.StateComplete:
			// A copy committed meanwhile: this one is its duplicate. Handling
			// it again finds the key complete without running the handler,
			// and reports it to the Observer as the duplicate it is.
			if o, herr := r.consumer.HandleKey(rctx, d.key, d.msg); herr == nil && o != dedupe.OutcomeDuplicate {
				r.cfg.Logger.WarnContext(ctx, "dedupenats: a key found complete was handled again (purged meanwhile?)",
					"scope", r.cfg.Scope, "key", d.key.ID, "outcome", o)
			}
			return true, dedupe.OutcomeDuplicate, r.ack(ctx, d), nil
		case rec.State != dedupe.StateFailed:
			return false, 0, nil, fmt.Errorf("key %s is held by a live lease", d.key)
		}
	}
	r.term(ctx, d, cause)
	return true, 0, cause, nil
}

// reject ends a message that can never be processed (dedupe.EventRefused):
// it has no usable key, or its key was used with another payload (cause).
// As the Kafka runner does, it records the message failed in the inbox
// under RefusedKey, so that it stays visible there (dedupe inspect) whether
// or not a dead-letter subject is set. Without Config.DeadLetterSubject the
// record is required: until it is made the message is naked with backoff
// (at the last delivery, held and retried), never terminated unseen. With
// it, the record is made when the database allows, and the message is
// copied there before it is terminated; a failed copy is retried (at the
// last delivery, held and retried until it succeeds). It returns what
// Handle does.
func (r *Runner) reject(ctx context.Context, p phase, d *delivery, cause error, last bool) error {
	r.event(ctx, dedupe.EventRefused, d, cause, 0)
	rctx := context.WithoutCancel(ctx)
	d.key = dedupe.Key{Scope: r.cfg.Scope, ID: RefusedKey(d.msg)}
	if r.cfg.DeadLetterSubject == "" {
		if last {
			_, err := r.settle(ctx, d, cause, true)
			return err
		}
		done, _, res, err := r.recordFailed(rctx, d, cause)
		if done {
			return res
		}
		res = errors.Join(cause, err)
		r.nak(ctx, p, d, res, r.cfg.Backoff(max(int(d.num), 1)))
		return res
	}
	if err := r.recordRefused(rctx, d, cause); err != nil {
		r.cfg.Logger.WarnContext(ctx, "dedupenats: recording a refused message failed; dead-lettering it",
			"scope", r.cfg.Scope, "key", d.key.ID, "subject", d.msg.Subject(), "err", err)
	}
	if last {
		_, err := r.settle(ctx, d, cause, false)
		return err
	}
	res, derr := r.deadLetterTerm(rctx, d, cause)
	if derr != nil {
		res = errors.Join(cause, derr)
		r.nak(ctx, p, d, res, r.cfg.Backoff(max(int(d.num), 1)))
	}
	return res
}

// recordRefused records a refused message's RefusedKey (d.key) failed with
// cause, once, within Config.AckTimeout. An earlier delivery's record counts.
func (r *Runner) recordRefused(ctx context.Context, d *delivery, cause error) error {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	_, _, err := r.inbox.RecordFailure(rctx, d.key, dedupe.Permanent(cause))
	return err
}
