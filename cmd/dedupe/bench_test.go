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

// BenchmarkRun measures what "dedupe run" adds around a trivial command:
// connect, claim, lease, complete, against running the command directly, and
// reports the ratio. Each iteration is a new key, so the command really runs.
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
	var direct time.Duration
	b.Run("direct", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			if err := exec.Command(truePath).Run(); err != nil {
				b.Fatal(err)
			}
		}
		direct = time.Since(start) / time.Duration(b.N)
	})
	b.Run("dedupe-run", func(b *testing.B) {
		n := 0
		start := time.Now()
		for b.Loop() {
			n++
			args := []string{"--database-url", db.URL, "run", "--scope", "bench", "--key", strconv.Itoa(n), "--", truePath}
			if code := run(ctx, args, io.Discard, io.Discard); code != 0 {
				b.Fatalf("run = %d", code)
			}
		}
		wrapped := time.Since(start) / time.Duration(b.N)
		if direct > 0 {
			b.ReportMetric(float64(wrapped)/float64(direct), "x-direct")
			b.Logf("dedupe run %v/op vs direct %v/op: %.1fx", wrapped, direct, float64(wrapped)/float64(direct))
		}
	})
	b.Run("dedupe-run-complete-key", func(b *testing.B) {
		// A later run of a complete key: connect and one claim, no command.
		args := []string{"--database-url", db.URL, "run", "--scope", "bench", "--key", "1", "--", truePath}
		start := time.Now()
		for b.Loop() {
			if code := run(ctx, args, io.Discard, io.Discard); code != 0 {
				b.Fatalf("run = %d", code)
			}
		}
		if direct > 0 {
			b.ReportMetric(float64(time.Since(start)/time.Duration(b.N))/float64(direct), "x-direct")
		}
	})
}
