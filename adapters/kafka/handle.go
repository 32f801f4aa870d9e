package dedupekafka

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// failedInBatchKey carries, into one Consumer.Handle call, the error a
// message's handler already returned inside a rolled-back batch, so that the
// attempt is recorded without running the handler a second time.
type failedInBatchKey struct{}

func (r *Runner) consumerHandler(ctx context.Context, tx pgx.Tx, msg kafka.Message) error {
	if err, ok := ctx.Value(failedInBatchKey{}).(error); ok {
		return err
	}
	if r.handler == nil {
		return r.batchH(ctx, tx, []kafka.Message{msg})
	}
	return r.handler(ctx, tx, msg)
}

// handleOne handles msg in its own transaction, retrying with backoff until
// it is handled, found a duplicate or given up on. failed, when not nil, is
// the error its handler returned in a batch just rolled back: it is recorded
// as the first attempt. handleOne reports false only when ctx ended first.
func (r *Runner) handleOne(ctx context.Context, msg kafka.Message, failed error) bool {
	if _, err := r.consumer.KeyOf(msg); err != nil {
		return r.giveUp(ctx, msg, err)
	}
	backoff := r.cfg.RetryBackoff
	for {
		hctx := ctx
		if failed != nil {
			hctx = context.WithValue(ctx, failedInBatchKey{}, failed)
			failed = nil
		}
		outcome, err := r.consumer.Handle(hctx, msg)
		switch {
		case err == nil && outcome == dedupe.OutcomeDuplicate:
			r.stats.duplicates.Add(1)
			return true
		case err == nil:
			r.stats.handled.Add(1)
			return true
		case outcome == dedupe.OutcomePoisoned, outcome == dedupe.OutcomeConflict, errors.Is(err, dedupe.ErrInvalidKey):
			return r.giveUp(ctx, msg, err)
		}
		if ctx.Err() != nil {
			return false
		}
		// OutcomeRetry (the handler failed), OutcomeInFlight, or the database
		// failed: the partition waits and tries the same message again.
		r.stats.retries.Add(1)
		if outcome != dedupe.OutcomeRetry {
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: message not handled, retrying",
				"topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "outcome", outcome, "err", err)
		}
		if !sleep(ctx, backoff) {
			return false
		}
		backoff = min(2*backoff, r.cfg.MaxRetryBackoff)
	}
}
