package main

import (
	"context"
	"io"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// BenchmarkRun measures what "dedupe run" adds around a trivial command
// (connect, claim, lease, complete) against running the command directly,
// and what a later run of a complete key costs (connect, one claim, no
// command). Each iteration does all three, interleaved so that load from
// other processes hits them alike, and the ratios are reported as metrics.
func BenchmarkRun(b *testing.B) {
	db := dbtest.New(b, dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	if code := run(ctx, []string{"--database-url", db.URL, "migrate", "up"}, io.Discard, io.Discard); code != 0 {
		b.Fatalf("migrate = %d", code)
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		b.Fatal(err)
	}
	dedupeRun := func(key string) {
		args := []string{"--database-url", db.URL, "run", "--scope", "bench", "--key", key, "--", truePath}
		if code := run(ctx, args, io.Discard, io.Discard); code != 0 {
			b.Fatalf("run = %d", code)
		}
	}
	var direct, wrapped, skipped time.Duration
	n := 0
	for b.Loop() {
		n++
		t0 := time.Now()
		if err := exec.Command(truePath).Run(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		dedupeRun(strconv.Itoa(n))
		t2 := time.Now()
		dedupeRun(strconv.Itoa(n)) // complete now: skipped
		t3 := time.Now()
		direct += t1.Sub(t0)
		wrapped += t2.Sub(t1)
		skipped += t3.Sub(t2)
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(b.N) }
	b.ReportMetric(per(direct), "direct-ns/op")
	b.ReportMetric(per(wrapped), "run-ns/op")
	b.ReportMetric(per(skipped), "skip-ns/op")
	b.ReportMetric(float64(wrapped)/float64(direct), "run/direct")
	b.ReportMetric(float64(skipped)/float64(direct), "skip/direct")
}
