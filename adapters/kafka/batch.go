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
// transaction each. It reports false only when ctx ended first.
func (r *Runner) handleBatch(ctx context.Context, msgs []kafka.Message) bool {
	keys := make([]dedupe.Key, len(msgs))
	for n, m := range msgs {
		k, err := r.consumer.KeyOf(m)
		if err != nil {
			return r.fallback(ctx, msgs, -1, nil)
		}
		keys[n] = k
	}
	for try := 0; ; try++ {
		failedAt, herr, err := r.batchTx(ctx, msgs, keys)
		switch {
		case err == nil && herr == nil:
			r.stats.batches.Add(1)
			return true
		case ctx.Err() != nil:
			return false
		case herr != nil:
			first, last := msgs[0], msgs[len(msgs)-1]
			if failedAt >= 0 {
				first, last = msgs[failedAt], msgs[failedAt]
			}
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: handler failed in batch; handling the batch one message at a time",
				"topic", first.Topic, "partition", first.Partition, "offsets", fmt.Sprintf("%d-%d", first.Offset, last.Offset), "err", herr)
			return r.fallback(ctx, msgs, failedAt, herr)
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
func (r *Runner) fallback(ctx context.Context, msgs []kafka.Message, failedAt int, failed error) bool {
	r.stats.fallbacks.Add(1)
	for n, m := range msgs {
		var f error
		if n == failedAt {
			f = failed
		}
		if !r.handleOne(ctx, m, f) {
			return false
		}
	}
	return true
}

// batchTx runs one batch transaction. It returns the index (-1 for a batch
// handler) and error of the first failing handler, or a database error; on
// either nothing committed.
func (r *Runner) batchTx(ctx context.Context, msgs []kafka.Message, keys []dedupe.Key) (failedAt int, herr, err error) {
	tx, err := r.inbox.DB().BeginTx(ctx, pgx.TxOptions{IsoLevel: r.cfg.IsoLevel})
	if err != nil {
		return -1, nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	claims, err := r.inbox.ClaimBatch(ctx, tx, keys)
	if err != nil {
		return -1, nil, err
	}
	var handled, dups int64
	var giveUp, fresh []int
	for n, c := range claims {
		switch c.Outcome {
		case dedupe.OutcomeClaimed:
			fresh = append(fresh, n)
		case dedupe.OutcomeDuplicate:
			dups++
		case dedupe.OutcomePoisoned, dedupe.OutcomeConflict:
			// ClaimBatch also reports a key repeated within the batch with
			// another fingerprint as a conflict.
			giveUp = append(giveUp, n)
		default:
			return -1, nil, errBatchInFlight
		}
	}
	if r.handler != nil {
		for _, n := range fresh {
			if err := r.run(dedupe.ContextWithClaim(ctx, claims[n]), tx, msgs[n]); err != nil {
				if retryable(err) {
					return -1, nil, fmt.Errorf("%w: %w", dedupe.ErrRetryable, err)
				}
				return n, err, nil
			}
			if res, ok := claims[n].PendingResult(); ok {
				if err := r.inbox.StoreResultTx(ctx, tx, claims[n], res); err != nil {
					return -1, nil, err
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
				return -1, nil, fmt.Errorf("%w: %w", dedupe.ErrRetryable, err)
			}
			return -1, err, nil
		}
		handled = int64(len(fresh))
	}
	if err := tx.Commit(ctx); err != nil {
		return -1, nil, err
	}
	r.stats.handled.Add(handled)
	r.stats.duplicates.Add(dups)
	for _, n := range giveUp {
		reason := claims[n].Outcome.Err()
		if !r.giveUp(ctx, msgs[n], fmt.Errorf("%w: %s", reason, keys[n])) {
			return -1, nil, ctx.Err()
		}
	}
	return -1, nil, nil
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
