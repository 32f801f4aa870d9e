package dedupe_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
)

func TestBeginConcurrentOnlyOneHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := dedupe.Key{Scope: "jobs", ID: "nightly-2026-01-01"}
	const n = 50
	claims := make([]*dedupe.Claim, n)
	errs := make([]error, n)
	together(n, func(i int) { claims[i], errs[i] = b.inbox.Begin(context.Background(), key) })
	held := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("begin %d: %v", i, errs[i])
		}
		switch claims[i].Outcome {
		case dedupe.OutcomeClaimed:
			held++
		case dedupe.OutcomeInFlight:
		default:
			t.Fatalf("begin %d: outcome %v", i, claims[i].Outcome)
		}
	}
	if held != 1 {
		t.Fatalf("%d holders, want 1", held)
	}
}

func TestLeaseCompleteThenDuplicateGetsResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "api", ID: "k1", Fingerprint: []byte("fp")}
	c, err := b.inbox.Begin(ctx, key)
	if err != nil || c.Outcome != dedupe.OutcomeClaimed || c.Attempt != 1 {
		t.Fatalf("begin = %+v, %v", c, err)
	}
	if !c.LockedUntil.Equal(b.clock.Now().Add(dedupe.DefaultLease)) {
		t.Fatalf("locked until %v, want now+lease", c.LockedUntil)
	}
	// While held, a duplicate is in flight.
	if d, err := b.inbox.Begin(ctx, key); err != nil || d.Outcome != dedupe.OutcomeInFlight {
		t.Fatalf("concurrent begin = %+v, %v; want in flight", d, err)
	}
	res := dedupe.Result{Status: 201, Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
	if err := b.inbox.Complete(ctx, c, res); err != nil {
		t.Fatal(err)
	}
	d, err := b.inbox.Begin(ctx, key)
	if err != nil || d.Outcome != dedupe.OutcomeDuplicate {
		t.Fatalf("after complete = %+v, %v; want duplicate", d, err)
	}
	if d.Result.Status != 201 || string(d.Result.Body) != `{"id":1}` || d.Result.Headers["Content-Type"][0] != "application/json" {
		t.Fatalf("stored result = %+v", d.Result)
	}
	// Same key, other payload: conflict, never the stored result.
	other := key
	other.Fingerprint = []byte("other")
	if d, err := b.inbox.Begin(ctx, other); err != nil || d.Outcome != dedupe.OutcomeConflict || d.Result != nil {
		t.Fatalf("other payload = %+v, %v; want conflict without result", d, err)
	}
}

func TestLeaseExpiryTakeoverFencesOldHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "api", ID: "k2"}
	old, err := b.inbox.Begin(ctx, key)
	if err != nil || old.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin = %+v, %v", old, err)
	}
	// The holder stalls past its lease; a retry takes over.
	b.clock.Advance(dedupe.DefaultLease + time.Second)
	nw, err := b.inbox.Begin(ctx, key)
	if err != nil || nw.Outcome != dedupe.OutcomeClaimed || nw.Attempt != 2 || nw.Token == old.Token {
		t.Fatalf("takeover = %+v, %v; want claimed, attempt 2, new token", nw, err)
	}
	// The old holder wakes up: every write it tries is refused.
	if err := b.inbox.Complete(ctx, old, dedupe.Result{Status: 200, Body: []byte("stale")}); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("late complete: %v, want ErrLeaseLost", err)
	}
	if err := b.inbox.Extend(ctx, old, 0); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("late extend: %v, want ErrLeaseLost", err)
	}
	if _, err := b.inbox.Fail(ctx, old, errors.New("x")); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("late fail: %v, want ErrLeaseLost", err)
	}
	if err := b.inbox.Complete(ctx, nw, dedupe.Result{Status: 200, Body: []byte("fresh")}); err != nil {
		t.Fatal(err)
	}
	rec, err := b.inbox.Lookup(ctx, key)
	if err != nil || string(rec.Result.Body) != "fresh" {
		t.Fatalf("stored = %+v, %v; want the successor's result", rec, err)
	}
}

func TestLeaseExtendKeepsHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "api", ID: "k3"}
	c, err := b.inbox.Begin(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(dedupe.DefaultLease - time.Second)
	if err := b.inbox.Extend(ctx, c, time.Minute); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(30 * time.Second) // past the first lease, inside the extension
	if d, err := b.inbox.Begin(ctx, key); err != nil || d.Outcome != dedupe.OutcomeInFlight {
		t.Fatalf("begin during extension = %+v, %v; want in flight", d, err)
	}
}

func TestLeaseFailReleasesForRetryAndPoisons(t *testing.T) {
	t.Parallel()
	b := setup(t, dedupe.Config{MaxAttempts: 2})
	ctx := context.Background()
	key := dedupe.Key{Scope: "api", ID: "k4"}
	c, err := b.inbox.Begin(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if poisoned, err := b.inbox.Fail(ctx, c, errors.New("503 from provider")); err != nil || poisoned {
		t.Fatalf("fail = %v, %v", poisoned, err)
	}
	// Released at once: no need to wait for the lease.
	c2, err := b.inbox.Begin(ctx, key)
	if err != nil || c2.Outcome != dedupe.OutcomeClaimed || c2.Attempt != 2 {
		t.Fatalf("retry = %+v, %v", c2, err)
	}
	if poisoned, err := b.inbox.Fail(ctx, c2, errors.New("503 again")); err != nil || !poisoned {
		t.Fatalf("last fail = %v, %v; want poisoned", poisoned, err)
	}
	if c3, err := b.inbox.Begin(ctx, key); err != nil || c3.Outcome != dedupe.OutcomePoisoned {
		t.Fatalf("after poison = %+v, %v", c3, err)
	}
}

func TestLeaseHolderDyingRepeatedlyIsPoisoned(t *testing.T) {
	t.Parallel()
	b := setup(t, dedupe.Config{MaxAttempts: 3})
	ctx := context.Background()
	key := dedupe.Key{Scope: "api", ID: "k5"}
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := b.inbox.Begin(ctx, key)
		if err != nil || c.Outcome != dedupe.OutcomeClaimed || c.Attempt != attempt {
			t.Fatalf("attempt %d = %+v, %v", attempt, c, err)
		}
		b.clock.Advance(dedupe.DefaultLease + time.Second) // the holder dies
	}
	if c, err := b.inbox.Begin(ctx, key); err != nil || c.Outcome != dedupe.OutcomePoisoned {
		t.Fatalf("after 3 deaths = %+v, %v; want poisoned", c, err)
	}
	rec, err := b.inbox.Lookup(ctx, key)
	if err != nil || rec.State != dedupe.StateFailed {
		t.Fatalf("record = %+v, %v", rec, err)
	}
}

// TestLeaseExpiryConcurrentTakeover: many retries arrive together after the
// holder died; exactly one takes over.
func TestLeaseExpiryConcurrentTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "api", ID: "k6"}
	if _, err := b.inbox.Begin(ctx, key); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Hour)
	var took atomic.Int64
	together(30, func(int) {
		c, err := b.inbox.Begin(ctx, key)
		if err != nil {
			t.Errorf("begin: %v", err)
			return
		}
		if c.Outcome == dedupe.OutcomeClaimed {
			took.Add(1)
		}
	})
	if took.Load() != 1 {
		t.Fatalf("%d takeovers, want 1", took.Load())
	}
}

func TestReleaseFencesHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "api", ID: "k7"}
	old, err := b.inbox.Begin(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Begin(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.Complete(ctx, old, dedupe.Result{}); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("complete after release: %v, want ErrLeaseLost", err)
	}
	if err := b.inbox.Release(ctx, dedupe.Key{Scope: "api", ID: "absent"}); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("release absent: %v, want ErrNotFound", err)
	}
}

func TestStatsCountsByScopeAndState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "a", ID: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "a", ID: "2"}); err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.Complete(ctx, c, dedupe.Result{}); err != nil {
		t.Fatal(err)
	}
	st, err := b.inbox.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].State != dedupe.StateComplete || st[0].Count != 1 ||
		st[1].State != dedupe.StateInFlight || st[1].LiveLeases != 1 || st[1].OldestInFlight.IsZero() {
		t.Fatalf("stats = %+v", st)
	}
}

func TestReleaseIdleRefusesALiveLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "api", ID: "k8"}
	if _, err := b.inbox.Begin(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.ReleaseIdle(ctx, key); !errors.Is(err, dedupe.ErrInFlight) {
		t.Fatalf("release of a live lease = %v, want ErrInFlight", err)
	}
	if _, err := b.inbox.Lookup(ctx, key); err != nil {
		t.Fatalf("the live key is gone: %v", err)
	}
	b.clock.Advance(dedupe.DefaultLease + time.Second)
	if err := b.inbox.ReleaseIdle(ctx, key); err != nil {
		t.Fatalf("release after the lease = %v", err)
	}
	if err := b.inbox.ReleaseIdle(ctx, key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("release of an absent key = %v, want ErrNotFound", err)
	}
}
