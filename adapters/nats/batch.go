package dedupenats

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// workBatches is work in batch mode (Config.BatchSize > 1): each batch is
// the message the worker waited for and what else the queue holds, up to
// BatchSize.
func (r *Runner) workBatches(ctx context.Context, p phase, queue <-chan jetstream.Msg) {
	batch := make([]jetstream.Msg, 0, r.cfg.BatchSize)
	for msg := range queue {
		batch = append(batch[:0], msg)
	fill:
		for len(batch) < r.cfg.BatchSize {
			select {
			case m, ok := <-queue:
				if !ok {
					break fill
				}
				batch = append(batch, m)
			default:
				break fill
			}
		}
		r.handleBatch(ctx, p, batch)
	}
}

// handleBatch handles msgs, all held by the heartbeat, with the core's
// dedupe.BatchConsumer: one statement claims every key, the handler runs for
// the new messages in the same transaction, and one commit makes claims and
// effects durable; only then is each message acknowledged. A message the
// batch did not settle gets what Handle would give it: a poisoned one is
// terminated, a refused one recorded under RefusedKey, the one whose handler
// failed handed back with Config.Backoff (its attempt was recorded), those
// left unattempted behind it handled again as a batch, and the others (in
// flight, the database failed) handled on their own, as Handle does.
//
// Messages at their last delivery (MaxDeliver) and those without a usable
// key never join a batch: they take Handle's path, so the rules for them
// are those of per-message mode. Once the run stops, the others are handed
// back, as in per-message mode.
func (r *Runner) handleBatch(ctx context.Context, p phase, msgs []jetstream.Msg) {
	ds := make([]delivery, 0, len(msgs))
	for _, msg := range msgs {
		if isClosed(p.stopping) && !r.atLastDelivery(msg) {
			r.handBack(ctx, p, msg)
			continue
		}
		d := newDelivery(msg)
		key, err := r.consumer.KeyOf(msg)
		if err != nil || (r.cfg.maxDeliver > 0 && d.num >= uint64(r.cfg.maxDeliver)) {
			r.handle(ctx, p, msg)
			continue
		}
		d.key = key
		ds = append(ds, d)
	}
	for len(ds) > 0 {
		ds = r.handleDeliveries(ctx, p, ds)
	}
}

// handleDeliveries handles ds as one batch (one alone as Handle does) and
// returns those left unattempted behind a failing message, to be handled
// again as a batch.
func (r *Runner) handleDeliveries(ctx context.Context, p phase, ds []delivery) []delivery {
	if len(ds) == 1 {
		r.handle(ctx, p, ds[0].msg)
		return nil
	}
	batch := make([]jetstream.Msg, len(ds))
	for n := range ds {
		batch[n] = ds[n].msg
	}
	res := r.batch.HandleBatch(ctx, batch)
	r.batchEvent(ctx, dedupe.EventBatchHandled, batch[0], nil, len(batch))
	// The committed first: their acknowledgements go out together.
	done := make([]*delivery, 0, len(res))
	for n, br := range res {
		if br.Err == nil {
			done = append(done, &ds[n])
		}
	}
	r.ackAll(ctx, done)
	var again []delivery
	fellBack := false
	for n, br := range res {
		d := &ds[n]
		he, handlerFailed := errors.AsType[*dedupe.HandlerError](br.Err)
		switch {
		case br.Err == nil:
			// Acknowledged above.
		case br.Outcome == dedupe.OutcomePoisoned:
			// The key is recorded as failed in the inbox.
			r.term(ctx, d, br.Err)
		case br.Outcome == dedupe.OutcomeConflict, errors.Is(br.Err, dedupe.ErrNoKey), errors.Is(br.Err, dedupe.ErrInvalidKey):
			r.reject(ctx, p, d, br.Err, false) //nolint:errcheck // reported to the Observer
		case ctx.Err() != nil, isClosed(p.stopping):
			// Stopping: hand it back (past DrainTimeout the batch rolled back).
			r.release(ctx, p, d, br.Err)
		case handlerFailed:
			// Its attempt is recorded: redelivered after Backoff.
			r.nak(ctx, p, d, br.Err, r.cfg.Backoff(max(he.Attempt, 1)))
		case errors.Is(br.Err, dedupe.ErrNotAttempted):
			again = append(again, *d)
		default:
			// In flight, outcome unknown, the database failed: on its own,
			// as Handle would.
			if !fellBack {
				fellBack = true
				r.batchEvent(ctx, dedupe.EventBatchFallback, d.msg, br.Err, len(res)-n)
			}
			r.handle(ctx, p, d.msg)
		}
	}
	return again
}

// ackAll acknowledges the messages of a batch whose effects committed. Their
// DoubleAcks go out together, ackers at a time, so that a batch waits for
// about one reply from the server rather than one after the other; an Ack
// (AckSingle) waits for nothing and goes from this goroutine.
func (r *Runner) ackAll(ctx context.Context, ds []*delivery) {
	if len(ds) <= 1 || r.cfg.AckMode == AckSingle {
		for _, d := range ds {
			r.ack(ctx, d) //nolint:errcheck // reported as dedupe.EventAckFailed
		}
		return
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(len(ds), ackers) {
		wg.Go(func() {
			for n := next.Add(1) - 1; n < int64(len(ds)); n = next.Add(1) - 1 {
				r.ack(ctx, ds[n]) //nolint:errcheck // reported as dedupe.EventAckFailed
			}
		})
	}
	wg.Wait()
}

// ackers bounds the DoubleAcks of one batch waiting for their replies at
// once.
const ackers = 16

// batchEvent tells the inbox's Observer what the runner did with a batch of
// count messages, the first of which is msg.
func (r *Runner) batchEvent(ctx context.Context, name string, msg jetstream.Msg, err error, count int) {
	if r.obs == nil {
		return
	}
	r.obs.TransportEvent(ctx, dedupe.TransportEvent{Name: name, Message: r.describe(msg), Err: err, Count: max(count, 1)})
}
