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
// does not deduplicate. Each iteration does both, interleaved so that load
// from other processes hits them alike, and the ratio is reported.
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
	handWritten := func(r TaskRun) {
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
	var hand, deduped time.Duration
	n := 0
	for b.Loop() {
		n++
		r := TaskRun{DagID: "bench", TaskID: "write", RunID: "run-" + strconv.Itoa(n), MapIndex: -1, Try: 1}
		t0 := time.Now()
		handWritten(r)
		t1 := time.Now()
		if _, err := w.handle(ctx, r); err != nil {
			b.Fatal(err)
		}
		hand += t1.Sub(t0)
		deduped += time.Since(t1)
	}
	b.ReportMetric(float64(hand)/float64(b.N), "hand-ns/op")
	b.ReportMetric(float64(deduped)/float64(b.N), "dedupe-ns/op")
	b.ReportMetric(float64(deduped)/float64(hand), "dedupe/hand")
}
