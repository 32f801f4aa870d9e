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

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
)

// outboxStream is the stream the relays publish to; its subject is the
// outbox messages' topic.
func outboxStream(ctx context.Context, js jetstream.JetStream, row int) (subject string, cleanup func(), err error) {
	name := "OUTBOX" + strconv.Itoa(row)
	subject = "outbox." + strconv.Itoa(row)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
		return "", nil, err
	}
	return subject, func() { _ = js.DeleteStream(context.WithoutCancel(ctx), name) }, nil
}

// enqueue writes the row's messages into the outbox, 500 per transaction.
func (b *bench) enqueue(ctx context.Context, ob *dedupe.Outbox, topic string) error {
	n := b.opts.transportMsgs
	for from := 0; from < n; from += 500 {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			for i := from; i < min(from+500, n); i++ {
				if _, err := ob.Enqueue(ctx, tx, dedupe.Message{ID: b.run + "-" + strconv.Itoa(i), Topic: topic, Payload: []byte(body)}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// relayHand is the hand-written relay: w loops each claiming 100 pending
// rows with FOR UPDATE SKIP LOCKED, publishing them to JetStream and
// awaiting the acks, then marking them published in the same transaction.
// It keeps no per-key order and no retry bookkeeping. Latency: one cycle.
func (b *bench) relayHand(ctx context.Context, js jetstream.JetStream, row, w int) (*result, error) {
	return b.drainOutbox(ctx, js, row, w, func(*dedupe.Outbox) (func(context.Context) (int, error), error) {
		return func(ctx context.Context) (int, error) { return handRelayCycle(ctx, b, js) }, nil
	})
}

// drainOutbox enqueues the row's messages and drains them with w loops, each
// calling a cycle newCycle returns over the outbox until every message was
// published.
// Latency: one cycle that published something.
func (b *bench) drainOutbox(ctx context.Context, js jetstream.JetStream, row, w int,
	newCycle func(ob *dedupe.Outbox) (func(context.Context) (int, error), error)) (*result, error) {
	ob, err := dedupe.NewOutbox(b.pool, nil)
	if err != nil {
		return nil, err
	}
	subject, cleanup, err := outboxStream(ctx, js, row)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := b.enqueue(ctx, ob, subject); err != nil {
		return nil, err
	}
	cycles := make([]func(context.Context) (int, error), w)
	for i := range cycles {
		if cycles[i], err = newCycle(ob); err != nil {
			return nil, err
		}
	}
	n := int64(b.opts.transportMsgs)
	var (
		published atomic.Int64
		lat       latencies
		wg        sync.WaitGroup
		firstErr  error
		errOnce   sync.Once
	)
	start := time.Now()
	for _, cycle := range cycles {
		wg.Go(func() {
			for published.Load() < n && ctx.Err() == nil {
				t0 := time.Now()
				got, err := cycle(ctx)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				if got == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				lat.add(time.Since(t0))
				published.Add(int64(got))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr == nil {
		firstErr = ctx.Err() // stopped before every message was published
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return drained("", "", "cycle of ≤100", w, int(n), elapsed, &lat), nil
}

func handRelayCycle(ctx context.Context, b *bench, js jetstream.JetStream) (int, error) {
	var got int
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlHandRelayClaim, 100)
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

// relayLib drains the same outbox with w dedupe.Relays driven by Cycle.
func (b *bench) relayLib(ctx context.Context, js jetstream.JetStream, row, w int) (*result, error) {
	pub, err := dedupenats.NewOutboxPublisher(js, nil)
	if err != nil {
		return nil, err
	}
	return b.drainOutbox(ctx, js, row, w, func(ob *dedupe.Outbox) (func(context.Context) (int, error), error) {
		relay, err := dedupe.NewRelay(ob, pub, dedupe.RelayConfig{BatchSize: 100, DisableListen: true})
		if err != nil {
			return nil, err
		}
		return relay.Cycle, nil
	})
}
