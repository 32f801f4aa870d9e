package main

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// BenchmarkWrite compares the worker's once-per-run write (claim plus writes
// in one transaction) with the same writes in a hand-written transaction that
// does not deduplicate, and reports the ratio.
func BenchmarkWrite(b *testing.B) {
	db := dbtest.New(b, dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	if err := prepare(ctx, db.Pool); err != nil {
		b.Fatal(err)
	}
	cfg := workerConfig{scope: "airflow-worker", account: "payouts", amount: 1}
	w, err := newWorker(db.Pool, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	run := func(n int) TaskRun {
		return TaskRun{DagID: "bench", TaskID: "write", RunID: "run-" + strconv.Itoa(n), MapIndex: -1, Try: 1}
	}
	var hand time.Duration
	b.Run("hand-written", func(b *testing.B) {
		n := 0
		start := time.Now()
		for b.Loop() {
			n++
			r := run(n)
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, sqlInsertLedger, r.DagID, r.TaskID, r.RunID, r.MapIndex, r.LogicalDate, r.Try, cfg.amount); err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, sqlCredit, cfg.account, cfg.amount); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		hand = time.Since(start) / time.Duration(b.N)
	})
	b.Run("dedupe", func(b *testing.B) {
		n := 1 << 30 // other keys than the hand-written loop's
		start := time.Now()
		for b.Loop() {
			n++
			if _, err := w.handle(ctx, run(n)); err != nil {
				b.Fatal(err)
			}
		}
		per := time.Since(start) / time.Duration(b.N)
		if hand > 0 {
			b.ReportMetric(float64(per)/float64(hand), "x-hand")
			b.Logf("dedupe %v/op vs hand-written %v/op: %.2fx", per, hand, float64(per)/float64(hand))
		}
	})
}
