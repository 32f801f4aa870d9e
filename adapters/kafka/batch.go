package dedupekafka

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// batchTxRetries is how often a batch aborted by a serialization failure or
// deadlock is run again before it falls back to one transaction per message.
const batchTxRetries = 3

// errBatchInFlight: a key of the batch is held by a live lease.
var errBatchInFlight = errors.New("dedupekafka: a key of the batch is in flight")

// handleBatch handles msgs (one partition, in offset order) in one
// transaction: one statement claims every key, the handler runs for the new
// ones, and one commit makes claims and effects durable. On a handler
// failure or a database error it rolls back and handles the messages one
// transaction each. It returns how many of msgs, from the first, are done
// (their offsets may be committed) and how it ended: all of them unless the
// context ended or a dead-letter write paused the partition.
func (r *Runner) handleBatch(ctx context.Context, msgs []kafka.Message) (int, step) {
	keys := make([]dedupe.Key, len(msgs))
	for n, m := range msgs {
		k, err := r.consumer.KeyOf(m)
		if err != nil {
			return r.fallback(ctx, msgs, -1, nil)
		}
		keys[n] = k
	}
	for try := 0; ; try++ {
		res, err := r.batchTx(ctx, msgs, keys)
		switch {
		case err == nil && res.herr == nil:
			r.stats.batches.Add(1)
			// The batch committed; give up on its poisoned and conflicting
			// messages, in order.
			for _, g := range res.giveUp {
				var st step
				if g.refused {
					st = r.refuse(ctx, msgs[g.n], g.err)
				} else {
					st = r.giveUp(ctx, msgs[g.n], g.err)
				}
				if st != stepDone {
					return g.n, st
				}
			}
			return len(msgs), stepDone
		case ctx.Err() != nil:
			return 0, stepStopped
		case res.herr != nil:
			first, last := msgs[0], msgs[len(msgs)-1]
			if res.failedAt >= 0 {
				first, last = msgs[res.failedAt], msgs[res.failedAt]
			}
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: handler failed in batch; handling the batch one message at a time",
				"topic", first.Topic, "partition", first.Partition, "offsets", fmt.Sprintf("%d-%d", first.Offset, last.Offset), "err", res.herr)
			return r.fallback(ctx, msgs, res.failedAt, res.herr)
		case errors.Is(err, dedupe.ErrRetryable) && try < batchTxRetries:
			continue
		default:
			if !errors.Is(err, errBatchInFlight) {
				r.cfg.Logger.WarnContext(ctx, "dedupekafka: batch failed; handling it one message at a time", "err", err)
			}
			return r.fallback(ctx, msgs, -1, nil)
		}
	}
}

// fallback handles msgs one transaction each, in order. failed is the
// handler error of msgs[failedAt] in the rolled-back batch.
func (r *Runner) fallback(ctx context.Context, msgs []kafka.Message, failedAt int, failed error) (int, step) {
	r.stats.fallbacks.Add(1)
	for n, m := range msgs {
		var f error
		if n == failedAt {
			f = failed
		}
		if st := r.handleOne(ctx, m, f); st != stepDone {
			return n, st
		}
	}
	return len(msgs), stepDone
}

// batchResult is what one batch transaction left to do.
type batchResult struct {
	failedAt int   // index of the failing handler's message, -1 for a batch handler
	herr     error // the handler's error: nothing committed
	giveUp   []batchGiveUp
}

// batchGiveUp is a message of a committed batch to give up on.
type batchGiveUp struct {
	n       int
	err     error
	refused bool // a conflict: the message has no failed key of its own
}

// batchTx runs one batch transaction. It returns the handler's failure (with
// the index of its message) or a database error, after which nothing
// committed, or the messages of the committed batch to give up on.
func (r *Runner) batchTx(ctx context.Context, msgs []kafka.Message, keys []dedupe.Key) (batchResult, error) {
	res := batchResult{failedAt: -1}
	tx, err := r.inbox.DB().BeginTx(ctx, pgx.TxOptions{IsoLevel: r.cfg.IsoLevel})
	if err != nil {
		return res, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	claims, err := r.inbox.ClaimBatch(ctx, tx, keys)
	if err != nil {
		return res, err
	}
	var handled, dups int64
	var fresh []int
	for n, c := range claims {
		switch c.Outcome {
		case dedupe.OutcomeClaimed:
			fresh = append(fresh, n)
		case dedupe.OutcomeDuplicate:
			dups++
		case dedupe.OutcomePoisoned, dedupe.OutcomeConflict:
			// ClaimBatch also reports a key repeated within the batch with
			// another fingerprint as a conflict.
			res.giveUp = append(res.giveUp, batchGiveUp{n: n, err: fmt.Errorf("%w: %s", c.Outcome.Err(), keys[n]),
				refused: c.Outcome == dedupe.OutcomeConflict})
		default:
			return res, errBatchInFlight
		}
	}
	if r.handler != nil {
		for _, n := range fresh {
			if err := r.run(dedupe.ContextWithClaim(ctx, claims[n]), tx, msgs[n]); err != nil {
				if retryable(err) {
					return res, fmt.Errorf("%w: %w", dedupe.ErrRetryable, err)
				}
				res.failedAt, res.herr = n, err
				return res, nil
			}
			if p, ok := claims[n].PendingResult(); ok {
				if err := r.inbox.StoreResultTx(ctx, tx, claims[n], p); err != nil {
					return res, err
				}
			}
			handled++
		}
	} else if len(fresh) > 0 {
		batch := make([]kafka.Message, len(fresh))
		for k, n := range fresh {
			batch[k] = msgs[n]
		}
		if err := r.runBatch(ctx, tx, batch); err != nil {
			if retryable(err) {
				return res, fmt.Errorf("%w: %w", dedupe.ErrRetryable, err)
			}
			res.herr = err
			return res, nil
		}
		handled = int64(len(fresh))
	}
	if err := tx.Commit(ctx); err != nil {
		return res, err
	}
	r.stats.handled.Add(handled)
	r.stats.duplicates.Add(dups)
	return res, nil
}

// run calls the handler, turning a panic into a *dedupe.PanicError.
func (r *Runner) run(ctx context.Context, tx pgx.Tx, msg kafka.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &dedupe.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return r.handler(ctx, tx, msg)
}

// runBatch calls the batch handler, turning a panic into a *dedupe.PanicError.
func (r *Runner) runBatch(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &dedupe.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return r.batchH(ctx, tx, msgs)
}

// retryable reports a serialization failure or deadlock, after which the
// whole transaction may run again without counting an attempt.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40001" || pgErr.Code == "40P01"
	}
	return errors.Is(err, dedupe.ErrRetryable)
}
