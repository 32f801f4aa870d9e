package dedupekafka

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

func (r *Runner) consumerHandler(ctx context.Context, tx pgx.Tx, msg kafka.Message) error {
	if r.handler == nil {
		return r.batchH(ctx, tx, []kafka.Message{msg})
	}
	return r.handler(ctx, tx, msg)
}

// handleOne handles msg in its own transaction, retrying with backoff until
// it is handled, found a duplicate or given up on. failed, when not nil, is
// the error its handler returned in a batch just rolled back: it is recorded
// as an attempt without running the handler again.
func (r *Runner) handleOne(ctx context.Context, msg kafka.Message, failed error) step {
	key, err := r.consumer.KeyOf(msg)
	if err != nil {
		return r.refuse(ctx, msg, err)
	}
	backoff := r.cfg.RetryBackoff
	for {
		var outcome dedupe.Outcome
		if failed != nil {
			outcome, err = r.recordFailure(ctx, key, failed)
			failed = nil
		} else {
			outcome, err = r.consumer.HandleKey(ctx, key, msg)
		}
		switch {
		case err == nil && outcome == dedupe.OutcomeDuplicate:
			r.stats.duplicates.Add(1)
			return stepDone
		case err == nil:
			r.stats.handled.Add(1)
			return stepDone
		case outcome == dedupe.OutcomePoisoned:
			return r.giveUp(ctx, msg, err)
		case outcome == dedupe.OutcomeConflict:
			// The key is complete with another payload: this message has no
			// failed key of its own.
			return r.refuse(ctx, msg, err)
		}
		if ctx.Err() != nil {
			return stepStopped
		}
		// OutcomeRetry (the handler failed), OutcomeInFlight, or the database
		// failed: the partition waits and tries the same message again.
		r.stats.retries.Add(1)
		if outcome != dedupe.OutcomeRetry {
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: message not handled, retrying",
				"topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "outcome", outcome, "err", err)
		}
		if !sleep(ctx, backoff) {
			return stepStopped
		}
		backoff = min(2*backoff, r.cfg.MaxRetryBackoff)
	}
}

// recordFailure counts the attempt that cause, key's handler error in a
// rolled-back batch, used up, and reports it the way Consumer.HandleKey
// reports a failed handler: OutcomeRetry, or OutcomePoisoned when the
// attempts are used up or cause is permanent.
func (r *Runner) recordFailure(ctx context.Context, key dedupe.Key, cause error) (dedupe.Outcome, error) {
	attempts, poisoned, err := r.inbox.RecordFailure(ctx, key, cause)
	if err != nil {
		return 0, errors.Join(cause, err)
	}
	he := &dedupe.HandlerError{Key: key, Attempt: attempts, Err: cause, Poisoned: poisoned}
	if poisoned {
		return dedupe.OutcomePoisoned, he
	}
	return dedupe.OutcomeRetry, he
}
