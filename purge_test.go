package dedupe_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestPurgeRemovesOnlyExpired(t *testing.T) {
	t.Parallel()
	b := setup(t, dedupe.Config{Retention: time.Hour, Lease: time.Hour, PurgeBatchSize: 7})
	ctx := context.Background()
	claimN := func(prefix string, n int) {
		for i := range n {
			c, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "s", ID: prefix + string(rune('a'+i))})
			if err != nil {
				t.Fatal(err)
			}
			if prefix != "live-" {
				if err := b.inbox.Complete(ctx, c, dedupe.Result{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	claimN("old-", 20) // written at t0
	b.clock.Advance(50 * time.Minute)
	claimN("live-", 3) // in flight, lease until t0+110m, expiry t0+110m
	claimN("new-", 5)  // complete at t0+50m
	b.clock.Advance(20 * time.Minute)
	// Now t0+70m: old-* expired (t0+60m); live-* and new-* not.
	n, err := b.inbox.Purge(ctx, 0)
	if err != nil || n != 20 {
		t.Fatalf("purge = %d, %v; want 20", n, err)
	}
	if got := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); got != 8 {
		t.Fatalf("rows left = %d, want 8", got)
	}
	// A grace period holds back keys that expired less than it ago.
	b.clock.Advance(45 * time.Minute) // t0+115m: new-* expired at t0+110m, live-* lease over too
	if n, err := b.inbox.Purge(ctx, 10*time.Minute); err != nil || n != 0 {
		t.Fatalf("purge with grace = %d, %v; want 0", n, err)
	}
	var batches []int64
	if n, err := b.inbox.PurgeProgress(ctx, 0, func(d int64) { batches = append(batches, d) }); err != nil || n != 8 {
		t.Fatalf("final purge = %d, %v; want 8", n, err)
	}
	if len(batches) != 2 || batches[1] != 8 {
		t.Fatalf("progress = %v, want two batches ending at 8", batches)
	}
	if _, err := b.inbox.Lookup(ctx, dedupe.Key{Scope: "s", ID: "new-a"}); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("purged key still there: %v", err)
	}
}

func TestPurgeNeverDeletesLiveLease(t *testing.T) {
	t.Parallel()
	b := setup(t, dedupe.Config{Retention: time.Minute, Lease: time.Minute})
	ctx := context.Background()
	c, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "s", ID: "long-job"})
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(50 * time.Second)
	if err := b.inbox.Extend(ctx, c, time.Hour); err != nil { // expiry stays at t0+1m
		t.Fatal(err)
	}
	b.clock.Advance(5 * time.Minute)
	if n, err := b.inbox.Purge(ctx, 0); err != nil || n != 0 {
		t.Fatalf("purge = %d, %v; want 0 (lease is live)", n, err)
	}
}

func TestPurgeUsesExpiryIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, `INSERT INTO dedupe_inbox (scope, key, state, token, created_at, updated_at, expires_at)
		SELECT 's', 'k' || g, 'complete', g, now(), now(), now() + g * interval '1 second'
		FROM generate_series(1, 20000) g`)
	b.db.Exec(t, "ANALYZE dedupe_inbox")
	rows, err := b.db.Pool.Query(context.Background(), `EXPLAIN SELECT ctid FROM dedupe_inbox
		WHERE expires_at <= now() AND (state <> 'in_flight' OR locked_until IS NULL OR locked_until <= now())
		ORDER BY expires_at LIMIT 1000 FOR UPDATE SKIP LOCKED`)
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if !strings.Contains(plan.String(), "dedupe_inbox_expires_at_idx") || strings.Contains(plan.String(), "Seq Scan") {
		t.Fatalf("purge does not walk the expiry index:\n%s", plan.String())
	}
}

func TestRunPurgerPurgesUntilCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, dedupe.Config{Retention: time.Hour, Lease: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	c, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "s", ID: "old"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.Complete(ctx, c, dedupe.Result{}); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(2 * time.Hour)
	done := make(chan error, 1)
	go func() { done <- b.inbox.RunPurger(ctx, 10*time.Millisecond) }()
	dbtest.WaitFor(t, 5*time.Second, "the expired key purged", func() bool {
		return b.db.Count(t, "SELECT count(*) FROM dedupe_inbox") == 0
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("RunPurger returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RunPurger did not stop")
	}
}

// TestPurgeRefusesNegativeAge: a negative olderThan would delete keys still
// within their retention (before, it did); it is a config error.
func TestPurgeRefusesNegativeAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "s", ID: "young"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.Complete(ctx, c, dedupe.Result{}); err != nil {
		t.Fatal(err)
	}
	n, err := b.inbox.Purge(ctx, -365*24*time.Hour)
	var ce *dedupe.ConfigError
	if n != 0 || !errors.As(err, &ce) || !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("purge(-1y) = %d, %v; want 0 and a *ConfigError", n, err)
	}
	if _, err := b.inbox.Lookup(ctx, dedupe.Key{Scope: "s", ID: "young"}); err != nil {
		t.Fatalf("the young key is gone: %v", err)
	}
}
