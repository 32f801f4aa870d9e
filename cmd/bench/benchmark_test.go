package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// benchSetup migrates a fresh schema and returns the scenarios' state.
func benchSetup(b *testing.B) *bench {
	b.Helper()
	db := dbtest.New(b, dbtest.Options{MaxConns: 4})
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, sqlCreateEffects); err != nil {
		b.Fatal(err)
	}
	be, err := newBench(&options{batch: 100, dupKeys: 1}, db.Pool, meter{wire: &wire{}})
	if err != nil {
		b.Fatal(err)
	}
	be.run = fmt.Sprintf("gb%d", time.Now().UnixNano())
	return be
}

// pairs are the library calls and their hand-written equivalents.
var pairs = []struct {
	name           string
	subject, hand  func(be *bench) op
	subjectName    string
	handName       string
	msgsPerOpLabel string
}{
	{"HandleVsHandWrittenClaim", func(be *bench) op { return be.opHandle }, func(be *bench) op { return be.opHandClaimEffect },
		"Consumer.Handle", "hand-written claim+effect", "msg"},
	{"HandWrittenClaimVsEffectOnly", func(be *bench) op { return be.opHandClaimEffect }, func(be *bench) op { return be.opHandEffect },
		"hand-written claim+effect", "effect only", "msg"},
	{"ClaimBatchVsHandWrittenBatch", func(be *bench) op { return be.opClaimBatch }, func(be *bench) op { return be.opHandBatch },
		"Inbox.ClaimBatch", "hand-written batch SQL", "batch of 100"},
}

// BenchmarkVersusHandWritten runs each library call and its hand-written
// equivalent alternately in the same loop (so both see the same machine) and
// reports both costs and their ratio: ratio > 1 means the library is slower.
// One worker; cmd/bench itself covers 8 and 32 workers.
func BenchmarkVersusHandWritten(b *testing.B) {
	for _, p := range pairs {
		b.Run(p.name, func(b *testing.B) {
			be := benchSetup(b)
			ctx := context.Background()
			subject, hand := p.subject(be), p.hand(be)
			var tSubject, tHand time.Duration
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				// Alternate which goes first, so neither always runs warm.
				first, second := subject, hand
				tf, ts := &tSubject, &tHand
				if i%2 == 1 {
					first, second, tf, ts = hand, subject, &tHand, &tSubject
				}
				t0 := time.Now()
				if _, err := first(ctx, 0); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if _, err := second(ctx, 0); err != nil {
					b.Fatal(err)
				}
				*tf += t1.Sub(t0)
				*ts += time.Since(t1)
			}
			n := float64(b.N)
			b.ReportMetric(float64(tSubject.Nanoseconds())/n, "subject-ns/op")
			b.ReportMetric(float64(tHand.Nanoseconds())/n, "baseline-ns/op")
			if tHand > 0 {
				ratio := float64(tSubject) / float64(tHand)
				b.ReportMetric(ratio, "ratio")
				b.Logf("%s vs %s (per %s): %.2f× the time", p.subjectName, p.handName, p.msgsPerOpLabel, ratio)
			}
		})
	}
}
