package dedupekafka

import (
	"context"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// handleOne handles msg in its own transaction, retrying with backoff until
// it is handled, found a duplicate or given up on.
func (r *Runner) handleOne(ctx context.Context, msg kafka.Message) step {
	key, err := r.consumer.KeyOf(msg)
	if err != nil {
		return r.refuse(ctx, msg, err)
	}
	backoff := r.cfg.RetryBackoff
	for {
		outcome, err := r.consumer.HandleKey(ctx, key, msg)
		switch {
		case err == nil:
			return stepDone
		case outcome == dedupe.OutcomePoisoned:
			return r.giveUp(ctx, msg, key, err)
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
		r.event(ctx, dedupe.EventRetried, &msg, key, err, backoff, 1)
		if outcome != dedupe.OutcomeRetry {
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: message not handled, retrying",
				"topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "outcome", outcome, "err", err)
		}
		if !sleep(ctx, backoff) {
			return stepStopped
		}
		backoff = r.cfg.retryBackoff().Next(backoff)
	}
}
