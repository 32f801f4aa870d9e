package main

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/outbox"
)

// relayBatch is the messages a relay cycle claims at most, on both sides.
const relayBatch = 100

// outboxBacklog empties the outbox, creates a stream for the run and writes
// the run's backlog into the outbox, its topic the stream's subject.
func (b *bench) outboxBacklog(ctx context.Context, backlog int64) (cleanup func(), err error) {
	if err := b.reset(ctx, b.run); err != nil {
		return nil, err
	}
	if err := truncate(ctx, b.pool, sqlResetOutbox); err != nil {
		return nil, err
	}
	name := "OUTBOX" + strconv.FormatInt(b.seq.Add(1), 10)
	subject := "outbox." + name
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
		return nil, err
	}
	cleanup = func() { _ = b.js.DeleteStream(context.WithoutCancel(ctx), name) }
	if _, err := b.pool.Exec(ctx, sqlOutboxBacklog, subject, backlog, b.run, body); err != nil {
		cleanup()
		return nil, err
	}
	// Fresh statistics, as autovacuum keeps them on a live outbox: the
	// planner then reads the pending rows through the pending index.
	if _, err := b.pool.Exec(ctx, "ANALYZE dedupe_outbox"); err != nil {
		cleanup()
		return nil, err
	}
	return cleanup, nil
}

// drainOutbox drains the run's backlog with w loops, each calling its cycle
// until the window closes. Latency: one cycle that published something.
func (b *bench) drainOutbox(ctx context.Context, w int, sp span,
	newCycle func() (func(context.Context) (int, error), error)) (*sample, error) {
	cleanup, err := b.outboxBacklog(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	cycles := make([]func(context.Context) (int, error), w)
	for i := range cycles {
		if cycles[i], err = newCycle(); err != nil {
			return nil, err
		}
	}
	win := newWindow(sp)
	var (
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	for _, cycle := range cycles {
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				t0 := time.Now()
				got, err := cycle(ctx)
				if err != nil {
					win.fail(err)
					return
				}
				if got == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				win.lat.add(time.Since(t0))
				win.add(int64(got))
			}
		})
	}
	s, err := win.measure(ctx, b.meter, b.opts.warmup)
	stop.Store(true)
	wg.Wait()
	return s, err
}

// relayHand is the hand-written relay: each loop claims up to 100 pending
// rows that head their key (no older pending row of the same topic and key;
// rows without a key always) with FOR UPDATE SKIP LOCKED, publishes them to
// JetStream and awaits the acks, then marks them published in the same
// transaction. That keeps per-key order (one message of a key in flight, in
// id order) like outbox.Relay, but takes one message per key and cycle and
// keeps no retry bookkeeping.
func (b *bench) relayHand(ctx context.Context, w int, sp span) (*sample, error) {
	return b.drainOutbox(ctx, w, sp, func() (func(context.Context) (int, error), error) {
		return func(ctx context.Context) (int, error) { return handRelayCycle(ctx, b, b.js) }, nil
	})
}

func handRelayCycle(ctx context.Context, b *bench, js jetstream.JetStream) (int, error) {
	var got int
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlHandRelayClaim, relayBatch)
		if err != nil {
			return err
		}
		type row struct {
			id        int64
			messageID string
			topic     string
			payload   []byte
		}
		var batch []row
		var r row
		if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.messageID, &r.topic, &r.payload}, func() error {
			batch = append(batch, r)
			return nil
		}); err != nil {
			return err
		}
		if len(batch) == 0 {
			return nil
		}
		futures := make([]jetstream.PubAckFuture, len(batch))
		ids := make([]int64, len(batch))
		for i, r := range batch {
			m := nats.NewMsg(r.topic)
			m.Header.Set(jetstream.MsgIDHeader, r.messageID)
			m.Data = r.payload
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				return err
			}
			futures[i], ids[i] = f, r.id
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := tx.Exec(ctx, sqlHandRelayMark, ids); err != nil {
			return err
		}
		got = len(batch)
		return nil
	})
	return got, err
}

// relayLib drains the same backlog with w dedupe.Relays driven by Cycle.
func (b *bench) relayLib(ctx context.Context, w int, sp span) (*sample, error) {
	pub, err := dedupenats.NewOutboxPublisher(b.js, dedupenats.OutboxPublisherConfig{})
	if err != nil {
		return nil, err
	}
	ob, err := outbox.New(b.pool, outbox.Config{})
	if err != nil {
		return nil, err
	}
	return b.drainOutbox(ctx, w, sp, func() (func(context.Context) (int, error), error) {
		relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{BatchSize: relayBatch, DisableListen: true})
		if err != nil {
			return nil, err
		}
		return relay.Cycle, nil
	})
}
