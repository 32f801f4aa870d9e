package dedupekafka

import (
	"context"
	"errors"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// handleBatch handles msgs (one partition, in offset order) with the core's
// dedupe.BatchConsumer: one transaction claims every key, runs the handler
// for the new ones and commits claims and effects together; a failing
// message is recorded and the others still commit. Then, in offset order,
// it gives up on the poisoned and refused messages and retries, one
// transaction each, the messages the batch could not settle. It returns how
// many of msgs, from the first, are done (their offsets may be committed)
// and how it ended: all of them unless the context ended or a dead-letter
// write paused the partition.
func (r *Runner) handleBatch(ctx context.Context, msgs []kafka.Message) (int, step) {
	res := r.batch.HandleBatch(ctx, msgs)
	r.batchEvent(ctx, dedupe.EventBatchHandled, &msgs[0], nil, len(msgs))
	fellBack := false
	for n, br := range res {
		var st step
		switch {
		case br.Err == nil:
			continue
		case br.Outcome == dedupe.OutcomePoisoned:
			st = r.giveUp(ctx, msgs[n], dedupe.Key{}, br.Err)
		case br.Outcome == dedupe.OutcomeConflict, errors.Is(br.Err, dedupe.ErrNoKey), errors.Is(br.Err, dedupe.ErrInvalidKey):
			// No failed key of its own: recorded under its refused key.
			st = r.refuse(ctx, msgs[n], br.Err)
		case ctx.Err() != nil:
			return n, stepStopped
		default:
			// Retry, in flight, outcome unknown or a database error: the
			// partition waits and tries this message again on its own.
			if !fellBack {
				fellBack = true
				r.batchEvent(ctx, dedupe.EventBatchFallback, &msgs[n], br.Err, len(msgs)-n)
			}
			if !errors.Is(br.Err, dedupe.ErrNotAttempted) {
				// Its attempt in the batch failed: it is tried again at once.
				r.event(ctx, dedupe.EventRetried, &msgs[n], dedupe.Key{}, br.Err, 0, 1)
			}
			st = r.handleOne(ctx, msgs[n])
		}
		if st != stepDone {
			return n, st
		}
	}
	return len(msgs), stepDone
}
