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
	if err := dedupe.Migrate(ctx, db.Pool, nil); err != nil {
		b.Fatal(err)
	}
	db.Exec(b, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_key text NOT NULL, note text)`)
	db.Exec(b, `CREATE TABLE processed (scope text, key text, PRIMARY KEY (scope, key))`)
	inbox, err := dedupe.New(db.Pool, nil)
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
	withDedupe := func(ctx context.Context, o order) error {
		_, err := c.Handle(ctx, o)
		return err
	}

	var seq atomic.Int64
	perOp := map[string]time.Duration{}
	run := func(name string, f func(context.Context, order) error) {
		b.Run(name, func(b *testing.B) {
			b.SetParallelism((workers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
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
	run("handwritten", handWritten)
	run("dedupe", withDedupe)

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

	for _, pair := range [][2]string{{"handwritten", "dedupe"}, {"handwritten-duplicate", "dedupe-duplicate"}} {
		if perOp[pair[1]] > 0 {
			b.Logf("%s / %s throughput ratio at %d workers: %.3f", pair[1], pair[0], workers,
				float64(perOp[pair[0]])/float64(perOp[pair[1]]))
		}
	}
}
