package dedupe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestKeepAliveRenewsUntilStoppedAndReportsLoss(t *testing.T) {
	t.Parallel()
	b := setup(t, dedupe.Config{Lease: time.Minute})
	ctx := context.Background()
	key := dedupe.Key{Scope: "jobs", ID: "long"}
	c, err := b.inbox.Begin(ctx, key)
	if err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin = %+v, %v", c, err)
	}
	first := c.LockedUntil
	hb := b.inbox.KeepAlive(ctx, c, 10*time.Millisecond)
	t.Cleanup(func() { _ = hb.Stop() })
	b.clock.Advance(50 * time.Second)
	dbtest.WaitFor(t, 5*time.Second, "a renewal", func() bool { return hb.LockedUntil().After(first) })
	// Past the first lease the key is still held.
	b.clock.Advance(30 * time.Second)
	dbtest.WaitFor(t, 5*time.Second, "a renewal past the first lease", func() bool {
		return hb.LockedUntil().After(b.clock.Now())
	})
	if d, err := b.inbox.Begin(ctx, key); err != nil || d.Outcome != dedupe.OutcomeInFlight {
		t.Fatalf("begin while renewed = %+v, %v; want in flight", d, err)
	}
	// An operator releases the key: the heartbeat notices.
	if err := b.inbox.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hb.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("lease loss not reported")
	}
	if err := hb.Stop(); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("stop = %v, want ErrLeaseLost", err)
	}
	if !c.LockedUntil.Equal(first) {
		t.Fatal("KeepAlive modified the caller's claim")
	}
}

func TestKeepAliveStopIsClean(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "jobs", ID: "short"})
	if err != nil {
		t.Fatal(err)
	}
	hb := b.inbox.KeepAlive(ctx, c, time.Millisecond)
	t.Cleanup(func() { _ = hb.Stop() })
	time.Sleep(20 * time.Millisecond)
	if err := hb.Stop(); err != nil {
		t.Fatalf("stop = %v", err)
	}
	if err := hb.Stop(); err != nil { // idempotent
		t.Fatalf("second stop = %v", err)
	}
	if err := b.inbox.Complete(ctx, c, dedupe.Result{}); err != nil {
		t.Fatalf("complete after heartbeat = %v", err)
	}
	// A claim that is not held cannot be kept alive.
	if err := b.inbox.KeepAlive(ctx, &dedupe.Claim{Outcome: dedupe.OutcomeDuplicate}, 0).Stop(); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("keepalive of a duplicate = %v", err)
	}
}

// TestKeepAliveGivesUpBeforeTheLeaseRunsOut: when renewals cannot reach the
// row (here a lock stalls them, as a lost database would), Lost closes while
// the lease still holds, before another attempt could take the key over.
func TestKeepAliveGivesUpBeforeTheLeaseRunsOut(t *testing.T) {
	t.Parallel()
	// Timing is the feature here: renewals give up one interval (1 s, the
	// slack a loaded machine gets) before the lease runs out.
	b := setup(t, dedupe.Config{Lease: 3 * time.Second, Clock: time.Now})
	ctx := context.Background()
	c, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "jobs", ID: "stalled"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "LOCK TABLE dedupe_inbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	hb := b.inbox.KeepAlive(ctx, c, time.Second)
	t.Cleanup(func() { _ = hb.Stop() })
	select {
	case <-hb.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("stalled renewals never reported the lease as lost")
	}
	if time.Now().After(c.LockedUntil) {
		t.Fatalf("lease reported lost only after it ran out (%v late)", time.Since(c.LockedUntil))
	}
	if err := hb.Stop(); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("stop = %v, want ErrLeaseLost", err)
	}
}
