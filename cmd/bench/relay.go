package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
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

// relayKey is the key of message i of n in a relay row: four of five
// messages are keyed, over n/5 keys (so about four messages per key, like
// the events of one order), so that per-key order is exercised (a key's
// messages go out one after another); the fifth has no key.
func relayKey(i, n int) string {
	if i%5 == 4 {
		return ""
	}
	return "k" + strconv.Itoa(i%max(n/5, 1))
}

// enqueue writes the row's messages into the outbox, 500 per transaction.
func (b *bench) enqueue(ctx context.Context, ob *dedupe.Outbox, topic string) error {
	n := b.opts.transportMsgs
	for from := 0; from < n; from += 500 {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			for i := from; i < min(from+500, n); i++ {
				if _, err := ob.Enqueue(ctx, tx, dedupe.Message{ID: b.run + "-" + strconv.Itoa(i), Topic: topic,
					Key: relayKey(i, n), Payload: []byte(body)}); err != nil {
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

// relayHand is the hand-written relay: w loops each claiming up to 100
// pending rows that head their key (no older pending row of the same topic
// and key; rows without a key always) with FOR UPDATE SKIP LOCKED,
// publishing them to JetStream and awaiting the acks, then marking them
// published in the same transaction. That keeps per-key order (one message
// of a key in flight, in id order) like dedupe.Relay, but takes one message
// per key and cycle and keeps no retry bookkeeping. Latency: one cycle.
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
	ob, err := dedupe.NewOutbox(b.pool, dedupe.OutboxConfig{})
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
	// Fresh statistics, as autovacuum keeps them on a live outbox: the
	// planner then reads the pending rows through the pending index.
	if _, err := b.pool.Exec(ctx, "ANALYZE dedupe_outbox"); err != nil {
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
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{})
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

// relayRows are the relay rows of the transport table: the hand-written
// relay, and dedupe.Relay compared with it.
var relayRows = []struct {
	name, baseline string
	f              func(b *bench, ctx context.Context, js jetstream.JetStream, row, w int) (*result, error)
}{
	{"hand-written outbox relay → JetStream", "", (*bench).relayHand},
	{"dedupe.Relay → JetStream", "hand-written outbox relay → JetStream", (*bench).relayLib},
}

// runRelays measures the relay rows at every worker count, -rounds times.
// In each round the two rows of a worker count run back to back (which goes
// first alternates by round), so that a ratio compares measurements of the
// same moment of a loaded machine. Per row it keeps the round of median
// throughput, with the median of the rounds' ratios, and notes the minimum.
func (rep *report) runRelays(ctx context.Context, b *bench, js jetstream.JetStream, log io.Writer) error {
	o := rep.opts
	type rowKey struct {
		name    string
		workers int
	}
	runs := map[rowKey][]*result{}
	stream := 1000 // stream names of their own
	for round := range o.rounds {
		for _, w := range o.workers {
			var thisRound []*result
			for i := range relayRows {
				rr := relayRows[(i+round)%len(relayRows)]
				if !o.selected(rr.name) {
					continue
				}
				stream++
				if err := b.reset(ctx, fmt.Sprintf("o%d", stream)); err != nil {
					return err
				}
				if _, err := b.pool.Exec(ctx, sqlResetOutbox); err != nil {
					return err
				}
				r, err := rr.f(b, ctx, js, stream, w)
				if err != nil {
					return fmt.Errorf("%s, %d relays: %w", rr.name, w, err)
				}
				r.scenario, r.baseline = rr.name, rr.baseline
				runs[rowKey{rr.name, w}] = append(runs[rowKey{rr.name, w}], r)
				thisRound = append(thisRound, r)
				fmt.Fprintf(log, "bench: %-40s workers=%-3d %9.0f msg/s p50=%v p99=%v (round %d)\n", r.scenario, w, r.throughput(), r.p50, r.p99, round+1)
			}
			fillRatios(thisRound)
		}
	}
	for _, w := range o.workers {
		for _, rr := range relayRows {
			rs := runs[rowKey{rr.name, w}]
			if len(rs) == 0 {
				continue
			}
			ratios := make([]float64, len(rs))
			for i, r := range rs {
				ratios[i] = r.ratio
			}
			slices.Sort(ratios)
			slices.SortFunc(rs, func(a, b *result) int { return cmp.Compare(a.throughput(), b.throughput()) })
			med := *rs[len(rs)/2]
			med.ratio = ratios[len(ratios)/2]
			if med.ratio > 0 {
				med.note = fmt.Sprintf("min %.2f×, median %.2f×", ratios[0], med.ratio)
			}
			rep.transports = append(rep.transports, &med)
		}
	}
	return nil
}
