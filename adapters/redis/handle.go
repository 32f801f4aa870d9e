package deduperedis

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/dedupe"
)

// Handle processes one entry: claim, handler and commit in one transaction,
// then the action its outcome calls for (see the package documentation).
// Run calls it for every entry; call it yourself only when you read
// entries yourself (through the runner's group and Config.Consumer). The
// entry is kept alive (its idle time reset) while Handle has it, and
// cancelling ctx is treated as a shutdown: the entry stays pending.
//
// It returns the outcome of the entry's last handling (0 when it had none)
// and nil when the entry was acknowledged, processed now or before.
// Otherwise the error says why not: the acknowledgement's error (with
// OutcomeClaimed or OutcomeDuplicate), or the handling's, or the reason the
// entry was given up on (matching ErrDeadLettered when a copy went to
// Config.DeadLetterStream).
func (r *Runner) Handle(ctx context.Context, msg *Message) (dedupe.Outcome, error) {
	r.take(msg)
	return r.handle(ctx, ctx.Done(), msg)
}

// handle is Handle for an entry already taken, with ctx the handlers'
// context (cancelled DrainTimeout after a stop) and stopping closed once
// the run stops.
func (r *Runner) handle(ctx context.Context, stopping <-chan struct{}, m *Message) (dedupe.Outcome, error) {
	defer r.done(m)
	if m.gone {
		return 0, r.refuse(ctx, m, fmt.Errorf("%w: entry %s of %s (delivered to group %s)", ErrTrimmed, m.ID, m.Stream, r.group))
	}
	key, kerr := r.consumer.KeyOf(m)
	if kerr != nil {
		return 0, r.refuse(ctx, m, kerr)
	}
	if r.cfg.MaxDeliveries > 0 && m.Deliveries > int64(r.cfg.MaxDeliveries) {
		return r.tooManyDeliveries(ctx, m, key)
	}
	for try := 1; ; try++ {
		outcome, err := r.consumer.HandleKey(ctx, key, m)
		he, handlerFailed := errors.AsType[*dedupe.HandlerError](err)
		switch {
		case err == nil:
			return outcome, r.ack(ctx, m, key)
		case outcome == dedupe.OutcomePoisoned:
			// The key is recorded as failed in the inbox.
			return outcome, r.giveUp(ctx, m, key, err)
		case outcome == dedupe.OutcomeConflict:
			return outcome, r.refuse(ctx, m, err)
		case ctx.Err() != nil:
			// Shutting down past DrainTimeout: whatever ran was rolled back
			// (or, if the commit raced the cancel, will be absorbed as a
			// duplicate). Never ack.
			r.release(ctx, m, key, err)
			return outcome, err
		}
		delay := r.cfg.Backoff(try)
		switch {
		case handlerFailed:
			delay = r.cfg.Backoff(max(he.Attempt, 1))
		case outcome == dedupe.OutcomeInFlight:
			delay = r.cfg.InFlightDelay
		}
		if isClosed(stopping) {
			r.release(ctx, m, key, err)
			return outcome, err
		}
		// A handler failure (an attempt, counted by the inbox), a concurrent
		// attempt holding the key, or the database failing: hold the entry,
		// kept alive by the heartbeat, and try again, rather than leave it
		// for another consumer to reclaim after ClaimIdle.
		r.event(ctx, dedupe.EventRetried, m, key, err, delay)
		sleep(ctx, stopping, delay)
		if isClosed(stopping) {
			r.release(ctx, m, key, err)
			return outcome, err
		}
	}
}

// ack acknowledges an entry whose effects committed (or were committed
// before) and returns the acknowledgement's error.
func (r *Runner) ack(ctx context.Context, m *Message, key dedupe.Key) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout)
	defer cancel()
	err := r.rdb.XAck(actx, r.stream, r.group, m.ID).Err()
	if err != nil {
		r.event(ctx, dedupe.EventAckFailed, m, key, err, 0)
	}
	return err
}

// release leaves an entry that was not settled pending, because the runner
// is stopping (cause: why, nil when it was never tried): another consumer
// reclaims it after ClaimIdle.
func (r *Runner) release(ctx context.Context, m *Message, key dedupe.Key, cause error) {
	r.event(ctx, dedupe.EventReleased, m, key, cause, 0)
}

// tooManyDeliveries gives up on an entry delivered more than MaxDeliveries
// times without running its handler: its key is recorded failed (a key
// found complete makes it a duplicate, acknowledged), then it is
// dead-lettered and acknowledged.
func (r *Runner) tooManyDeliveries(ctx context.Context, m *Message, key dedupe.Key) (dedupe.Outcome, error) {
	cause := dedupe.Permanent(fmt.Errorf("%w: %d deliveries, at most %d", ErrTooManyDeliveries, m.Deliveries, r.cfg.MaxDeliveries))
	for try := 1; ; try++ {
		o, settled, err := r.recordFailed(ctx, m, key, cause)
		if err == nil {
			if settled {
				return o, r.ack(ctx, m, key)
			}
			return 0, r.giveUp(ctx, m, key, cause)
		}
		if !r.wait(ctx, m, key, err, try) {
			return 0, err
		}
	}
}

// recordFailed records key failed with cause. settled reports that it was
// found complete instead: the entry is a duplicate of one that committed
// (o is then OutcomeDuplicate), to be acknowledged.
func (r *Runner) recordFailed(ctx context.Context, m *Message, key dedupe.Key, cause error) (o dedupe.Outcome, settled bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	_, poisoned, err := r.inbox.RecordFailure(rctx, key, cause)
	if err != nil {
		return 0, false, fmt.Errorf("record as failed: %w", err)
	}
	if poisoned {
		return 0, false, nil
	}
	rec, err := r.inbox.Lookup(rctx, key)
	switch {
	case err != nil:
		return 0, false, fmt.Errorf("look up: %w", err)
	case rec.State == dedupe.StateComplete:
		// Handling it again finds the key complete without running the
		// handler, and reports it to the Observer as the duplicate it is.
		if o, herr := r.consumer.HandleKey(rctx, key, m); herr == nil && o != dedupe.OutcomeDuplicate {
			r.cfg.Logger.WarnContext(ctx, "deduperedis: a key found complete was handled again (purged meanwhile?)",
				"scope", r.cfg.Scope, "key", key.ID, "outcome", o)
		}
		return dedupe.OutcomeDuplicate, true, nil
	case rec.State != dedupe.StateFailed:
		return 0, false, fmt.Errorf("key %s is held by a live lease", key)
	}
	return 0, false, nil
}

// wait is the pause between two tries to settle an entry the runner gives
// up on (err: why the last try failed). It reports false when the runner
// is past its DrainTimeout: the entry is then left pending (released), to
// be settled by the consumer that reclaims it. An entry whose body is gone
// cannot be left: it is tried again until it is recorded.
func (r *Runner) wait(ctx context.Context, m *Message, key dedupe.Key, err error, try int) bool {
	delay := r.cfg.Backoff(try)
	if ctx.Err() != nil && !m.gone {
		r.release(ctx, m, key, err)
		return false
	}
	r.event(ctx, dedupe.EventRetried, m, key, err, delay)
	sleep(context.WithoutCancel(ctx), nil, delay)
	return true
}

// settleCtx is the context a give-up runs on: an entry whose body is gone
// has no pending entry left to fall back on, so its record is not cut short
// by the drain's end.
func settleCtx(ctx context.Context, m *Message) context.Context {
	if m.gone {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// giveUp ends an entry whose key is recorded failed (cause: why): a copy
// to Config.DeadLetterStream and the entry's XACK, in one MULTI/EXEC
// (without a dead-letter stream, the XACK alone). A Redis failure is tried
// again with Backoff.
func (r *Runner) giveUp(ctx context.Context, m *Message, key dedupe.Key, cause error) error {
	ctx = settleCtx(ctx, m)
	for try := 1; ; try++ {
		err := r.deadLetterAck(ctx, m, key, cause)
		if err == nil {
			res := cause
			if r.cfg.DeadLetterStream != "" {
				r.event(ctx, dedupe.EventDeadLettered, m, key, cause, 0)
				res = errors.Join(cause, ErrDeadLettered)
			}
			r.event(ctx, dedupe.EventTerminated, m, key, res, 0)
			return res
		}
		if r.cfg.DeadLetterStream != "" {
			err = fmt.Errorf("dead-letter to %s: %w", r.cfg.DeadLetterStream, err)
			r.event(ctx, dedupe.EventDeadLetterFailed, m, key, err, 0)
		} else {
			r.event(ctx, dedupe.EventAckFailed, m, key, err, 0)
		}
		if !r.wait(ctx, m, key, err, try) {
			return errors.Join(cause, err)
		}
	}
}

// refuse ends an entry that can never be processed (dedupe.EventRefused):
// it has no usable key, its key was used with another payload, or its body
// was trimmed away (cause). It records RefusedKey failed in the inbox,
// with cause, then gives it up (dead-letter copy and XACK).
func (r *Runner) refuse(ctx context.Context, m *Message, cause error) error {
	ctx = settleCtx(ctx, m)
	key := dedupe.Key{Scope: r.cfg.Scope, ID: RefusedKey(m.Stream, m.ID)}
	r.event(ctx, dedupe.EventRefused, m, key, cause, 0)
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
		_, _, err := r.inbox.RecordFailure(rctx, key, dedupe.Permanent(cause))
		cancel()
		if err == nil {
			// Recorded now, or by an earlier delivery of the same entry.
			return r.giveUp(ctx, m, key, cause)
		}
		err = fmt.Errorf("record refused entry: %w", err)
		if !r.wait(ctx, m, key, err, try) {
			return errors.Join(cause, err)
		}
	}
}
