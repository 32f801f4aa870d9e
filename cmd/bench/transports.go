package main

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/pgerr"
)

// idHeader carries the business key of the transports' messages.
const idHeader = "Order-Id"

// natsStream creates a stream and durable consumer for one run and
// publishes its backlog, each message with a unique Order-Id.
func (b *bench) natsStream(ctx context.Context, backlog int64) (jetstream.Consumer, func(), error) {
	js := b.js
	name := "BENCH" + strconv.FormatInt(b.seq.Add(1), 10)
	subject := "bench." + name
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = js.DeleteStream(context.WithoutCancel(ctx), name) }
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 10000,
	})
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	for i := range backlog {
		m := nats.NewMsg(subject)
		id := b.run + "-" + strconv.FormatInt(i, 10)
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set(idHeader, id)
		m.Data = []byte(body)
		if _, err := js.PublishMsgAsync(m); err != nil {
			cleanup()
			return nil, nil, err
		}
		// Wait for the acks every 1000 messages: the client refuses more
		// than a few thousand unacknowledged publishes.
		if (i+1)%1000 == 0 || i == backlog-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				cleanup()
				return nil, nil, ctx.Err()
			}
		}
	}
	return cons, cleanup, nil
}

// natsHand is the hand-written JetStream consumer: one pull iterator with
// the runner's read-ahead (max(2×workers, 64)) feeding w workers, each
// running the hand-written claim + effect transaction, committing, then
// DoubleAck, as the runner does by default. Latency: the transaction.
func (b *bench) natsHand(ctx context.Context, w int, sp span) (*sample, error) {
	if err := b.reset(ctx, b.run); err != nil {
		return nil, err
	}
	cons, cleanup, err := b.natsStream(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	it, err := cons.Messages(jetstream.PullMaxMessages(max(2*w, 64)))
	if err != nil {
		return nil, err
	}
	win := newWindow(sp)
	msgs := make(chan jetstream.Msg)
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(msgs)
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-rctx.Done():
				return
			}
		}
	})
	for range w {
		wg.Go(func() {
			for m := range msgs {
				t0 := time.Now()
				if _, err := b.handClaimEffectTx(rctx, benchScope, m.Headers().Get(idHeader)); err != nil {
					if rctx.Err() == nil {
						win.fail(err)
					}
					_ = m.Nak()
					continue
				}
				win.lat.add(time.Since(t0))
				win.add(1) // committed, counted as the runner's are
				if err := m.DoubleAck(rctx); err != nil && rctx.Err() == nil {
					win.fail(err)
				}
			}
		})
	}
	s, err := win.measure(ctx, b.meter, b.opts.warmup)
	stop()
	it.Stop()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	return s, b.checkEffects(ctx)
}

// natsBatch is the batch size of the batch-mode rows.
const natsBatch = 100

// natsRunner drains the same backlog with dedupenats.Runner (DoubleAck, its
// default). Latency: the handling, from the claim's BEGIN to a successful
// COMMIT, timed by the inbox's Observer (window.observed).
func (b *bench) natsRunner(ctx context.Context, w int, sp span) (*sample, error) {
	return b.natsRunnerSized(ctx, w, sp, 1)
}

// natsRunnerBatch is natsRunner in batch mode, natsBatch messages per
// transaction.
func (b *bench) natsRunnerBatch(ctx context.Context, w int, sp span) (*sample, error) {
	return b.natsRunnerSized(ctx, w, sp, natsBatch)
}

// natsRunnerSized is natsRunner with Config.BatchSize batch.
func (b *bench) natsRunnerSized(ctx context.Context, w int, sp span, batch int) (*sample, error) {
	if err := b.reset(ctx, b.run); err != nil {
		return nil, err
	}
	cons, cleanup, err := b.natsStream(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	win := newWindow(sp)
	inbox, err := dedupe.New(b.pool, win.observed(b.inbox.Config()))
	if err != nil {
		return nil, err
	}
	r, err := dedupenats.New(inbox, cons, dedupenats.Config{
		Scope:      benchScope,
		Key:        dedupenats.HeaderKey(idHeader),
		Workers:    w,
		BatchSize:  batch,
		PullExpiry: time.Second, // a prompt stop after the window; a backlog fills every pull at once
	}, func(ctx context.Context, tx pgx.Tx, _ jetstream.Msg) error {
		_, err := tx.Exec(ctx, sqlEffect, dedupe.ClaimFromContext(ctx).Key.ID, body)
		return err
	})
	if err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	s, err := win.measure(ctx, b.meter, b.opts.warmup)
	stop()
	if rerr := <-done; err == nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	return s, b.checkEffects(ctx)
}

// natsHandBatch is the hand-written batch JetStream consumer doing the
// runner's batch-mode work: one pull iterator with the runner's read-ahead
// in batch mode (max(workers×natsBatch, 64)) feeding w workers; each takes
// the message it waited for and what else is buffered, up to natsBatch,
// claims their keys with one statement, writes each new message's effect
// with a statement of its own (as the runner's per-message handler does),
// commits, then DoubleAcks each message. Latency: the transaction.
func (b *bench) natsHandBatch(ctx context.Context, w int, sp span) (*sample, error) {
	if err := b.reset(ctx, b.run); err != nil {
		return nil, err
	}
	cons, cleanup, err := b.natsStream(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	it, err := cons.Messages(jetstream.PullMaxMessages(max(w*natsBatch, 64)))
	if err != nil {
		return nil, err
	}
	win := newWindow(sp)
	msgs := make(chan jetstream.Msg, max(w*natsBatch, 64))
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(msgs)
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-rctx.Done():
				return
			}
		}
	})
	for range w {
		wg.Go(func() {
			batch := make([]jetstream.Msg, 0, natsBatch)
			ids := make([]string, 0, natsBatch)
			for m := range msgs {
				batch, ids = append(batch[:0], m), ids[:0]
			fill:
				for len(batch) < natsBatch {
					select {
					case m, ok := <-msgs:
						if !ok {
							break fill
						}
						batch = append(batch, m)
					default:
						break fill
					}
				}
				for _, m := range batch {
					ids = append(ids, m.Headers().Get(idHeader))
				}
				t0 := time.Now()
				if err := b.handClaimEffectsTx(rctx, ids); err != nil {
					if rctx.Err() == nil {
						win.fail(err)
					}
					for _, m := range batch {
						_ = m.Nak()
					}
					continue
				}
				win.lat.add(time.Since(t0))
				win.add(int64(len(batch))) // committed, counted as the runner's are
				for _, m := range batch {
					if err := m.DoubleAck(rctx); err != nil && rctx.Err() == nil {
						win.fail(err)
					}
				}
			}
		})
	}
	s, err := win.measure(ctx, b.meter, b.opts.warmup)
	stop()
	it.Stop()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	return s, b.checkEffects(ctx)
}

// handClaimEffectsTx is the hand-written batch transaction: one statement
// claims ids, then each claimed one's effect is written on its own, and
// one commit. A deadlock or serialization failure runs it again.
func (b *bench) handClaimEffectsTx(ctx context.Context, ids []string) error {
	for try := 1; ; try++ {
		now := time.Now()
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, sqlHandClaimBatch, benchScope, ids, now, now.Add(dedupe.DefaultRetention))
			if err != nil {
				return err
			}
			claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			for _, id := range claimed {
				if _, err := tx.Exec(ctx, sqlEffect, id, body); err != nil {
					return err
				}
			}
			return nil
		})
		if code, ok := pgerr.SQLState(err); !ok || (code != "40001" && code != "40P01") || try == handRetries {
			return err
		}
	}
}
