package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// benchBatch is how many messages one pipeline run carries end to end.
const benchBatch = 500

// BenchmarkPipeline measures messages per second end to end (publish,
// consume, claim, effect, commit, ack) for the Runner with DoubleAck, the
// Runner with Ack, and a hand-written consumer doing the claim SQL itself
// with DoubleAck, in interleaved rounds of the same run, with 1 and 4
// workers. Each consumes on its own connection, so it also reports the
// outgoing NATS messages (acks, pull requests, InProgress) per message. It
// reports the median and minimum rate of each, and the medians' ratios to
// the hand-written consumer.
//
//	go test -run '^$' -bench Pipeline -benchtime 10x ./adapters/nats/
func BenchmarkPipeline(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchPipeline(b, workers) })
	}
}

// pipeline is one consumer under measurement.
type pipeline struct {
	name    string
	subject string
	nc      *nats.Conn
	done    atomic.Int64
	rates   []float64
	sent    uint64 // outgoing NATS messages of its connection
	msgs    int
}

func benchPipeline(b *testing.B, workers int) {
	db := dbtest.New(b)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		b.Fatal(err)
	}
	db.Exec(b, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_id text NOT NULL, body bytea)`)
	srv := natstest.Server(b)
	pubNC := natstest.Connect(b, srv)
	pubJS, err := jetstream.New(pubNC)
	if err != nil {
		b.Fatal(err)
	}
	// consumerOf creates a stream and durable named name, and returns the
	// durable on a connection of its own.
	consumerOf := func(name string) (*nats.Conn, jetstream.Consumer) {
		if _, err := pubJS.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
			b.Fatal(err)
		}
		if _, err := pubJS.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			b.Fatal(err)
		}
		nc := natstest.Connect(b, srv)
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		cons, err := js.Consumer(ctx, name, name)
		if err != nil {
			b.Fatal(err)
		}
		return nc, cons
	}

	var pipes []*pipeline
	for _, mode := range []dedupenats.AckMode{dedupenats.AckDouble, dedupenats.AckSingle} {
		name := map[dedupenats.AckMode]string{dedupenats.AckDouble: "DOUBLEACK", dedupenats.AckSingle: "ACK"}[mode]
		p := &pipeline{name: "runner-" + strings.ToLower(name), subject: name + ".orders"}
		var cons jetstream.Consumer
		p.nc, cons = consumerOf(name)
		// Each runner's own inbox counts its messages as their handlings
		// commit (just before their acks).
		counted, err := dedupe.New(db.Pool, dedupe.Config{Observer: observetest.OnHandled(func(_ dedupe.HandleInfo, d dedupe.HandleDone) {
			if d.Outcome == dedupe.OutcomeClaimed {
				p.done.Add(1)
			}
		})})
		if err != nil {
			b.Fatal(err)
		}
		r, err := dedupenats.New(counted, cons, dedupenats.Config{
			Workers: workers,
			AckMode: mode,
		}, insertEffect)
		if err != nil {
			b.Fatal(err)
		}
		stop := dbtest.Background(b, p.name, r.Run)
		defer stop()
		pipes = append(pipes, p)
	}
	hand := &pipeline{name: "hand-written", subject: "HAND.orders"}
	var handCons jetstream.Consumer
	hand.nc, handCons = consumerOf("HAND")
	stopHand := handWritten(b, db.Pool, handCons, workers, &hand.done)
	defer stopHand()
	pipes = append(pipes, hand)

	b.ResetTimer()
	for i := range b.N {
		// Rotate the order of the pipelines from round to round.
		for k := range pipes {
			p := pipes[(i+k)%len(pipes)]
			target := p.done.Load() + benchBatch
			sentBefore := p.nc.Stats().OutMsgs
			start := time.Now()
			for n := range benchBatch {
				m := nats.NewMsg(p.subject)
				m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%d-%d", i, n))
				m.Data = []byte("order")
				if _, err := pubJS.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			deadline := time.Now().Add(60 * time.Second)
			for p.done.Load() < target {
				if time.Now().After(deadline) {
					b.Fatalf("%s: %d of %d messages after 60s", p.name, p.done.Load()-target+benchBatch, benchBatch)
				}
				time.Sleep(time.Millisecond)
			}
			p.rates = append(p.rates, benchBatch/time.Since(start).Seconds())
			p.sent += p.nc.Stats().OutMsgs - sentBefore
			p.msgs += benchBatch
		}
	}
	b.StopTimer()
	handMedian := median(hand.rates)
	for _, p := range pipes {
		med := median(p.rates)
		perMsg := float64(p.sent) / float64(p.msgs)
		b.ReportMetric(med, p.name+"-msgs/s")
		b.ReportMetric(perMsg, p.name+"-out/msg")
		if p != hand {
			b.ReportMetric(med/handMedian, p.name+"-ratio")
		}
		b.Logf("workers=%d %-16s median %5.0f msgs/s, min %5.0f, ratio to hand-written %.2f, %.3f outgoing NATS msgs per message",
			workers, p.name, med, slices.Min(p.rates), med/handMedian, perMsg)
	}
}

// median returns the median of xs.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// handWritten is what a careful developer writes without the library:
// workers pull (nats.go's default buffer of 500 messages), begin a
// transaction, claim the key with one upsert, write the effect, commit and
// DoubleAck.
func handWritten(b *testing.B, pool *pgxpool.Pool, cons jetstream.Consumer, workers int, done *atomic.Int64) (stop func()) {
	it, err := cons.Messages()
	if err != nil {
		b.Fatal(err)
	}
	const claimSQL = `INSERT INTO dedupe_inbox (scope, key, state, attempts, token, created_at, updated_at, expires_at)
VALUES ($1, $2, 'complete', 1, 0, now(), now(), now() + interval '7 days') ON CONFLICT (scope, key) DO NOTHING`
	handle := func(ctx context.Context, msg jetstream.Msg) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
		tag, err := tx.Exec(ctx, claimSQL, "HAND", msg.Headers().Get(jetstream.MsgIDHeader))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			if err := insertEffectHand(ctx, tx, msg); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		return msg.DoubleAck(ctx)
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				msg, err := it.Next()
				if err != nil {
					return
				}
				if err := handle(context.Background(), msg); err != nil {
					_ = msg.Nak()
					continue
				}
				done.Add(1)
			}
		})
	}
	return func() {
		it.Stop()
		wg.Wait()
	}
}

func insertEffectHand(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_id, body) VALUES ($1, $2)",
		msg.Headers().Get(jetstream.MsgIDHeader), msg.Data())
	return err
}
