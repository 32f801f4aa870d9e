package dedupe_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// BenchmarkHandle compares Consumer.Handle with the hand-written equivalent
// (BEGIN; INSERT … ON CONFLICT DO NOTHING into a processed table; the effect
// insert; COMMIT) at 8 concurrent workers, in the same run, and logs the
// throughput ratio. Run with:
//
//	go test -run '^$' -bench BenchmarkHandle -benchtime 5s -v .
func BenchmarkHandle(b *testing.B) {
	const workers = 8
	db := dbtest.New(b, dbtest.Options{MaxConns: workers + 2})
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		b.Fatal(err)
	}
	db.Exec(b, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_key text NOT NULL, note text)`)
	db.Exec(b, `CREATE TABLE processed (scope text, key text, PRIMARY KEY (scope, key))`)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		b.Fatal(err)
	}
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "bench", Key: orderKey}, insertEffect)
	if err != nil {
		b.Fatal(err)
	}
	handWritten := func(ctx context.Context, o order) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO processed (scope, key) VALUES ($1, $2) ON CONFLICT DO NOTHING`, "bench", o.ID)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			return insertEffect(ctx, tx, o)
		})
	}
	// The same hand-written claim writing the row the inbox keeps (state,
	// token, timestamps, expiry index): what a careful hand-rolled inbox
	// with retention costs, to separate the cost of the row from the cost
	// of the library's code.
	db.Exec(b, `CREATE TABLE processed_full (LIKE dedupe_inbox INCLUDING ALL)`)
	handWrittenFull := func(ctx context.Context, o order) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			now := time.Now()
			tag, err := tx.Exec(ctx, `INSERT INTO processed_full
				(scope, key, state, attempts, token, created_at, updated_at, expires_at)
				VALUES ($1, $2, 'complete', 1, 0, $3, $3, $4) ON CONFLICT DO NOTHING`,
				"bench", o.ID, now, now.Add(7*24*time.Hour))
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			return insertEffect(ctx, tx, o)
		})
	}
	withDedupe := func(ctx context.Context, o order) error {
		_, err := c.Handle(ctx, o)
		return err
	}
	// The same with an Observer (one that does nothing) and a Describe as a
	// transport adapter sets it: the cost of the observation seam itself.
	observed, err := dedupe.New(db.Pool, dedupe.Config{Observer: dedupe.NopObserver{}})
	if err != nil {
		b.Fatal(err)
	}
	oc, err := dedupe.NewConsumer(observed, dedupe.ConsumerConfig[order]{Scope: "bench", Key: orderKey,
		Describe: func(o order) dedupe.MessageInfo {
			return dedupe.MessageInfo{System: "nats", Destination: "orders.created", ID: o.ID, Group: "bench", Partition: -1, Offset: -1, Delivery: 1}
		}}, insertEffect)
	if err != nil {
		b.Fatal(err)
	}
	withObserver := func(ctx context.Context, o order) error {
		_, err := oc.Handle(ctx, o)
		return err
	}

	var seq atomic.Int64
	perOp := map[string]time.Duration{}
	parallelism := (workers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0)
	run := func(name string, f func(context.Context, order) error) {
		b.Run(name, func(b *testing.B) {
			b.SetParallelism(parallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := f(ctx, order{ID: fmt.Sprintf("%s-%d", name, seq.Add(1))}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			perOp[name] = b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
	// alternate runs a and b in turn in every worker, so both see the same
	// machine, table sizes and checkpoints, and reports b's time over a's.
	alternate := func(name string, a, bf func(context.Context, order) error) {
		b.Run(name, func(b *testing.B) {
			var ta, tb atomic.Int64
			b.SetParallelism(parallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := seq.Add(1)
					start := time.Now()
					if err := a(ctx, order{ID: fmt.Sprintf("a-%d", n)}); err != nil {
						b.Error(err)
						return
					}
					mid := time.Now()
					if err := bf(ctx, order{ID: fmt.Sprintf("b-%d", n)}); err != nil {
						b.Error(err)
						return
					}
					ta.Add(int64(mid.Sub(start)))
					tb.Add(int64(time.Since(mid)))
				}
			})
			b.StopTimer()
			ratio := float64(ta.Load()) / float64(tb.Load())
			b.ReportMetric(ratio, "throughput-ratio")
			b.Logf("%s: dedupe / hand-written throughput ratio, interleaved, %d workers: %.3f", name, workers, ratio)
		})
	}
	run("handwritten", handWritten)
	run("handwritten-inbox-row", handWrittenFull)
	run("dedupe", withDedupe)
	run("dedupe-observed", withObserver)
	alternate("interleaved", handWritten, withDedupe)

	// Redeliveries: every message is a duplicate of one already committed.
	const seeded = 1000
	for n := range seeded {
		if err := handWritten(ctx, order{ID: fmt.Sprintf("dup-%d", n)}); err != nil {
			b.Fatal(err)
		}
		if err := withDedupe(ctx, order{ID: fmt.Sprintf("dup-%d", n)}); err != nil {
			b.Fatal(err)
		}
	}
	runDup := func(name string, f func(context.Context, order) error) {
		run(name, func(ctx context.Context, _ order) error {
			return f(ctx, order{ID: fmt.Sprintf("dup-%d", seq.Add(1)%seeded)})
		})
	}
	runDup("handwritten-duplicate", handWritten)
	runDup("dedupe-duplicate", withDedupe)

	for _, pair := range [][2]string{{"handwritten", "dedupe"}, {"handwritten-inbox-row", "dedupe"},
		{"handwritten-duplicate", "dedupe-duplicate"}} {
		if perOp[pair[1]] > 0 {
			b.Logf("%s / %s throughput ratio at %d workers: %.3f", pair[1], pair[0], workers,
				float64(perOp[pair[0]])/float64(perOp[pair[1]]))
		}
	}
}
