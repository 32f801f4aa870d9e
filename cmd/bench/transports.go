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

// natsStream empties the run's effects (reset), creates a stream and
// durable consumer for one run and publishes its backlog, each message with
// a unique Order-Id.
func (b *bench) natsStream(ctx context.Context, backlog int64) (jetstream.Consumer, func(), error) {
	if err := b.reset(ctx, b.run); err != nil {
		return nil, nil, err
	}
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
// DoubleAck, as the runner does by default (handConsume).
func (b *bench) natsHand(ctx context.Context, w int, sp span) (*sample, error) {
	return b.natsHandRow(ctx, w, sp, max(2*w, 64), 0, func(ctx context.Context, win *window, msgs <-chan jetstream.Msg) {
		handConsume(ctx, b, win, msgs, natsID,
			func(m jetstream.Msg) error { return m.DoubleAck(ctx) },
			func(m jetstream.Msg) { _ = m.Nak() })
	})
}

// natsHandRow is the frame of the hand-written JetStream consumers: one
// pull iterator reading readAhead messages ahead (PullMaxMessages) passes
// them through a channel of buf to w workers running work until the
// window is measured.
func (b *bench) natsHandRow(ctx context.Context, w int, sp span, readAhead, buf int,
	work func(ctx context.Context, win *window, msgs <-chan jetstream.Msg)) (*sample, error) {
	cons, cleanup, err := b.natsStream(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	win := newWindow(sp)
	return b.drainRow(ctx, win, func(rctx context.Context) (func() error, error) {
		it, err := cons.Messages(jetstream.PullMaxMessages(readAhead))
		if err != nil {
			return nil, err
		}
		msgs := make(chan jetstream.Msg, buf)
		var wg sync.WaitGroup
		wg.Go(func() { natsFeed(rctx, it, msgs) })
		for range w {
			wg.Go(func() { work(rctx, win, msgs) })
		}
		return func() error { it.Stop(); wg.Wait(); return nil }, nil
	})
}

// natsFeed passes the iterator's messages to msgs until it stops or ctx
// ends, then closes msgs.
func natsFeed(ctx context.Context, it jetstream.MessagesContext, msgs chan<- jetstream.Msg) {
	defer close(msgs)
	for {
		m, err := it.Next()
		if err != nil {
			return
		}
		select {
		case msgs <- m:
		case <-ctx.Done():
			return
		}
	}
}

// natsID is a JetStream message's business key.
func natsID(m jetstream.Msg) string { return m.Headers().Get(idHeader) }

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
	cons, cleanup, err := b.natsStream(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return b.runnerRow(ctx, sp, func(inbox *dedupe.Inbox) (runner, error) {
		return dedupenats.New(inbox, cons, dedupenats.Config{
			Scope:      benchScope,
			Key:        dedupenats.HeaderKey(idHeader),
			Workers:    w,
			BatchSize:  batch,
			PullExpiry: time.Second, // a prompt stop after the window; a backlog fills every pull at once
		}, effect[jetstream.Msg])
	})
}

// natsHandBatch is the hand-written batch JetStream consumer doing the
// runner's batch-mode work: one pull iterator with the runner's read-ahead
// in batch mode (max(workers×natsBatch, 64)) feeding w workers; each takes
// the message it waited for and what else is buffered, up to natsBatch,
// claims their keys with one statement, writes each new message's effect
// with a statement of its own (as the runner's per-message handler does),
// commits, then DoubleAcks each message. Latency: the transaction.
func (b *bench) natsHandBatch(ctx context.Context, w int, sp span) (*sample, error) {
	return b.natsHandRow(ctx, w, sp, max(w*natsBatch, 64), max(w*natsBatch, 64), func(ctx context.Context, win *window, msgs <-chan jetstream.Msg) {
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
				ids = append(ids, natsID(m))
			}
			t0 := time.Now()
			if err := b.handClaimEffectsTx(ctx, ids); err != nil {
				if ctx.Err() == nil {
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
				if err := m.DoubleAck(ctx); err != nil && ctx.Err() == nil {
					win.fail(err)
				}
			}
		}
	})
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
