package failover

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
)

// TestFailoverLeasesAndFencingTokens: leased claims taken on the old primary
// keep their meaning on the new one. A live lease still holds its key (the
// new primary's clock decides, as the old one's did), its holder completes
// with its fencing token, and a lease that ran out is taken over with a new
// token, after which the old holder's completion is refused (ErrLeaseLost)
// and the new holder's accepted. Synchronous replication: the claims
// committed before the failover are on the new primary.
func TestFailoverLeasesAndFencingTokens(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := Start(t, Options{Sync: true})
	setupSchema(t, c)
	pool := newPool(t, c.URL(), 4)
	// Two inboxes on one table: a lease outliving the failover by far, and
	// one that runs out during it.
	long, err := dedupe.New(pool, dedupe.Config{Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	short, err := dedupe.New(pool, dedupe.Config{Lease: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	held := dedupe.Key{Scope: "jobs", ID: "held"}
	lapsed := dedupe.Key{Scope: "jobs", ID: "lapsed"}
	a, err := long.Begin(ctx, held)
	if err != nil || a.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin %s = %+v, %v", held, a, err)
	}
	b, err := short.Begin(ctx, lapsed)
	if err != nil || b.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin %s = %+v, %v", lapsed, b, err)
	}

	c.Failover()

	// The live lease holds on the new primary.
	dup, err := long.Begin(ctx, held)
	if dup == nil || dup.Outcome != dedupe.OutcomeInFlight || !errors.Is(err, dedupe.ErrInFlight) && err != nil {
		t.Fatalf("a second Begin of a live lease on the new primary = %+v, %v; want in flight", dup, err)
	}
	if err := long.Complete(ctx, a, dedupe.Result{Body: []byte("done")}); err != nil {
		t.Fatalf("the holder's Complete on the new primary: %v", err)
	}
	if again, err := long.Begin(ctx, held); err != nil || again.Outcome != dedupe.OutcomeDuplicate {
		t.Fatalf("Begin after the completion = %+v, %v; want duplicate", again, err)
	}

	// The lapsed lease is taken over with a new token; the old holder is
	// fenced off.
	var taken *dedupe.Claim
	for taken == nil {
		cl, err := short.Begin(ctx, lapsed)
		switch {
		case err == nil && cl.Outcome == dedupe.OutcomeClaimed:
			taken = cl
		case cl != nil && cl.Outcome == dedupe.OutcomeInFlight:
			time.Sleep(20 * time.Millisecond) // the lease has not run out on the database's clock yet
		default:
			t.Fatalf("taking over %s = %+v, %v", lapsed, cl, err)
		}
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
	if taken.Token == b.Token {
		t.Fatalf("the takeover kept the old token %d", b.Token)
	}
	if err := short.Complete(ctx, b, dedupe.Result{}); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("the old holder's Complete after a takeover = %v, want ErrLeaseLost", err)
	}
	if err := short.Complete(ctx, taken, dedupe.Result{Body: []byte("new")}); err != nil {
		t.Fatalf("the new holder's Complete: %v", err)
	}
	rec, err := short.Lookup(ctx, lapsed)
	if err != nil || rec.State != dedupe.StateComplete || rec.Token != taken.Token {
		t.Fatalf("record of %s = %+v, %v; want complete under the new token", lapsed, rec, err)
	}
}
