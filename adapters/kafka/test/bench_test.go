package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// benchEnv is one benchmark run's schema, broker and topic (one partition,
// so that every variant does the same sequential work).
type benchEnv struct {
	b *bundle
}

func newBenchEnv(b *testing.B) *benchEnv {
	db := dbtest.New(b, dbtest.Options{MaxConns: 4})
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		b.Fatal(err)
	}
	db.Exec(b, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_id text NOT NULL, part int, off bigint, body bytea)`)
	log := newTestLog(b)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{Logger: log.logger})
	if err != nil {
		b.Fatal(err)
	}
	return &benchEnv{b: &bundle{log: log, db: db, inbox: inbox, brokers: cluster(b, 1, "orders").ListenAddrs(), topic: "orders", group: "bench"}}
}

// run produces b.N messages, starts the consumer, and times it from its
// first effect to its last (so that joining the group is not counted).
func (e *benchEnv) run(b *testing.B, consume func(ctx context.Context)) time.Duration {
	msgs := make([]kafka.Message, b.N+1)
	for n := range msgs {
		msgs[n] = msg(fmt.Sprintf("m-%d", n), "", []byte("body"))
	}
	e.b.produce(b, msgs...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); consume(ctx) }()
	defer func() { cancel(); <-done }()

	b.ResetTimer()
	var start time.Time
	deadline := time.Now().Add(120 * time.Second)
	for {
		n := e.b.effects(b)
		if n > 0 && start.IsZero() {
			start = time.Now()
		}
		if n == b.N+1 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d effects within 120s", n, b.N+1)
		}
		time.Sleep(200 * time.Microsecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	return elapsed
}

// runner consumes with the adapter: per-message handler h or batch
// handler bh.
func (e *benchEnv) runner(b *testing.B, batch int, h dedupekafka.HandlerFunc, bh dedupekafka.BatchHandlerFunc) func(ctx context.Context) {
	var (
		r   *dedupekafka.Runner
		err error
	)
	rc := readerConfig(e.b.brokers, e.b.group, e.b.topic)
	// The runner's own inbox counts its batches.
	obs := observetest.New()
	inbox, err := dedupe.New(e.b.db.Pool, dedupe.Config{Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	if bh != nil {
		r, err = dedupekafka.NewBatch(inbox, rc, dedupekafka.Config{BatchSize: batch}, bh)
	} else {
		r, err = dedupekafka.New(inbox, rc, dedupekafka.Config{BatchSize: batch}, h)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if n := obs.Events(dedupe.EventBatchHandled); n > 0 {
			b.ReportMetric(float64(obs.Covered(dedupe.EventBatchHandled))/float64(n), "msgs/batch")
		}
	})
	return func(ctx context.Context) {
		if err := r.Run(ctx); err != nil {
			b.Error(err)
		}
	}
}

// Hand-written batch consumer: a kafka-go group reader over the same topic,
// the same inbox table and effects; a goroutine prefetching into a buffer, one
// unnest upsert per batch of up to batch messages gathered with a 5ms linger
// (the adapter's default), effects, one commit, one offset commit, no library.
const handClaim = `INSERT INTO dedupe_inbox (scope, key, state, token, created_at, updated_at, expires_at)
SELECT $1, k, 'complete', 0, now(), now(), now() + interval '7 days' FROM unnest($2::text[]) AS k
ON CONFLICT (scope, key) DO NOTHING RETURNING key`

func (e *benchEnv) handwritten(b *testing.B, batch int, batchEffects bool) func(ctx context.Context) {
	return func(ctx context.Context) {
		rd := kafka.NewReader(readerConfig(e.b.brokers, e.b.group, e.b.topic))
		defer rd.Close()
		ch := make(chan kafka.Message, 2*batch)
		go func() {
			defer close(ch)
			for {
				m, err := rd.FetchMessage(ctx)
				if err != nil {
					return
				}
				ch <- m
			}
		}()
		defer func() {
			for range ch { // let the fetcher exit
			}
		}()
		msgs := make([]kafka.Message, 0, batch)
		for {
			m, ok := <-ch
			if !ok {
				return
			}
			msgs = append(msgs[:0], m)
			linger := time.NewTimer(5 * time.Millisecond)
		fill:
			for len(msgs) < batch {
				select {
				case m, ok := <-ch:
					if !ok {
						break fill
					}
					msgs = append(msgs, m)
				case <-linger.C:
					break fill
				}
			}
			linger.Stop()
			if err := e.handBatch(ctx, msgs, batchEffects); err != nil {
				if ctx.Err() == nil {
					b.Error(err)
				}
				return
			}
			if err := rd.CommitMessages(ctx, msgs[len(msgs)-1]); err != nil {
				return
			}
		}
	}
}

func (e *benchEnv) handBatch(ctx context.Context, msgs []kafka.Message, batchEffects bool) error {
	keys := make([]string, len(msgs))
	byKey := make(map[string]kafka.Message, len(msgs))
	for n, m := range msgs {
		keys[n] = dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...)
		byKey[keys[n]] = m
	}
	tx, err := e.b.db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	rows, err := tx.Query(ctx, handClaim, e.b.group, keys)
	if err != nil {
		return err
	}
	fresh, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if batchEffects {
		ms := make([]kafka.Message, len(fresh))
		for n, k := range fresh {
			ms[n] = byKey[k]
		}
		if err := insertEffects(ctx, tx, ms); err != nil {
			return err
		}
	} else {
		for _, k := range fresh {
			if err := insertEffect(ctx, tx, byKey[k]); err != nil {
				return err
			}
		}
	}
	return tx.Commit(ctx)
}

// BenchmarkConsume measures end-to-end consumption through a real
// Kafka-protocol broker (kfake) and PostgreSQL, one partition, batches of
// 100: per-message mode; batch mode with a per-message handler against a
// hand-written batch consumer doing the same statements; and batch mode with
// a batch handler (one effects statement per batch) against the hand-written
// equivalent. The batch variants report their throughput relative to
// per-message mode and to their hand-written twin (best run of each). Run
// with e.g. -benchtime=5000x -count=5: the machine's other load makes single
// runs noisy.
func BenchmarkConsume(b *testing.B) {
	const batch = 100
	// ns per message of each variant: the best of its runs (with -count), the
	// estimate least disturbed by other load on the machine.
	ns := map[string]float64{}
	variant := func(name string, consume func(e *benchEnv, b *testing.B) func(context.Context), than ...string) {
		b.Run(name, func(b *testing.B) {
			e := newBenchEnv(b)
			got := float64(e.run(b, consume(e, b)).Nanoseconds()) / float64(b.N)
			// The testing package's probe run (b.N = 1) times one or two
			// messages that may commit together: not a rate.
			if old, ok := ns[name]; b.N >= 100 && (!ok || got < old) {
				ns[name] = got
			}
			for _, other := range than {
				if ns[other] > 0 {
					b.ReportMetric(ns[other]/ns[name], "x-"+other)
				}
			}
		})
	}
	variant("per-message", func(e *benchEnv, b *testing.B) func(context.Context) { return e.runner(b, 1, insertEffect, nil) })
	variant("handwritten", func(e *benchEnv, b *testing.B) func(context.Context) { return e.handwritten(b, batch, false) })
	variant("batch", func(e *benchEnv, b *testing.B) func(context.Context) { return e.runner(b, batch, insertEffect, nil) },
		"per-message", "handwritten")
	variant("handwritten-batch-effects", func(e *benchEnv, b *testing.B) func(context.Context) { return e.handwritten(b, batch, true) })
	variant("batch-handler", func(e *benchEnv, b *testing.B) func(context.Context) { return e.runner(b, batch, nil, insertEffects) },
		"per-message", "handwritten-batch-effects")
	if ns["batch"] > 0 && ns["batch-handler"] > 0 && ns["per-message"] > 0 {
		b.Logf("batch mode, per-message handler: %.1fx per-message mode, %.2f of hand-written",
			ns["per-message"]/ns["batch"], ns["handwritten"]/ns["batch"])
		b.Logf("batch mode, batch handler:       %.1fx per-message mode (target >= 10), %.2f of hand-written (target >= 0.9)",
			ns["per-message"]/ns["batch-handler"], ns["handwritten-batch-effects"]/ns["batch-handler"])
	}
}
