package dedupenats_test

import (
	"context"
	"fmt"
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
)

// benchBatch is how many messages one pipeline run carries end to end.
const benchBatch = 500

// BenchmarkPipeline measures messages per second end to end (publish,
// consume, claim, effect, commit, DoubleAck) with 4 workers, for the Runner
// and for a hand-written consumer doing the claim SQL itself, alternating in
// the same run; it reports both rates and their ratio (target ≥ 0.9).
//
//	go test -run '^$' -bench Pipeline -benchtime 5x ./adapters/nats/
func BenchmarkPipeline(b *testing.B) {
	db := dbtest.New(b)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, nil); err != nil {
		b.Fatal(err)
	}
	db.Exec(b, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_id text NOT NULL, body bytea)`)
	inbox, err := dedupe.New(db.Pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	srv := natstest.Server(b)
	nc := natstest.Connect(b, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	consumerOf := func(name string) jetstream.Consumer {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
			b.Fatal(err)
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			b.Fatal(err)
		}
		return cons
	}

	// The runner.
	var runnerDone atomic.Int64
	r, err := dedupenats.New(inbox, consumerOf("RUNNER"), insertEffect, &dedupenats.Config{
		Workers: 4,
		Metrics: dedupenats.MetricsFunc(func(_ context.Context, e dedupenats.Event) {
			if e.Kind == dedupenats.KindProcessed {
				runnerDone.Add(1)
			}
		}),
	})
	if err != nil {
		b.Fatal(err)
	}
	stopRunner := dbtest.Background(b, "runner", r.Run)

	// The hand-written equivalent.
	var handDone atomic.Int64
	stopHand := handWritten(b, db.Pool, consumerOf("HAND"), &handDone)

	defer func() {
		stopRunner()
		stopHand()
	}()

	var runnerTime, handTime time.Duration
	b.ResetTimer()
	for i := range b.N {
		pipelines := []struct {
			subject string
			done    *atomic.Int64
			total   *time.Duration
		}{{"RUNNER.orders", &runnerDone, &runnerTime}, {"HAND.orders", &handDone, &handTime}}
		if i%2 == 1 {
			pipelines[0], pipelines[1] = pipelines[1], pipelines[0]
		}
		for _, p := range pipelines {
			target := p.done.Load() + benchBatch
			start := time.Now()
			for n := range benchBatch {
				m := nats.NewMsg(p.subject)
				m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%d-%d", i, n))
				m.Data = []byte("order")
				if _, err := js.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for p.done.Load() < target {
				if time.Now().After(deadline) {
					b.Fatalf("%s: %d of %d messages after 30s", p.subject, p.done.Load()-target+benchBatch, benchBatch)
				}
				time.Sleep(time.Millisecond)
			}
			*p.total += time.Since(start)
		}
	}
	b.StopTimer()
	msgs := float64(b.N * benchBatch)
	runnerRate, handRate := msgs/runnerTime.Seconds(), msgs/handTime.Seconds()
	b.ReportMetric(runnerRate, "runner-msgs/s")
	b.ReportMetric(handRate, "hand-msgs/s")
	b.ReportMetric(runnerRate/handRate, "ratio")
	b.Logf("runner %.0f msgs/s, hand-written %.0f msgs/s, ratio %.2f (n=%d batches of %d)",
		runnerRate, handRate, runnerRate/handRate, b.N, benchBatch)
}

// handWritten is what a careful developer writes without the library: four
// workers pull, begin a transaction, claim the key with one upsert, write the
// effect, commit and DoubleAck.
func handWritten(b *testing.B, pool *pgxpool.Pool, cons jetstream.Consumer, done *atomic.Int64) (stop func()) {
	it, err := cons.Messages(jetstream.PullMaxMessages(4))
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
	for range 4 {
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
