package dedupetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/dedupetest"
)

// charge is the handler under test: one charge row per order.
type charge struct {
	OrderID string
	Cents   int
}

const chargesTable = `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL, cents int NOT NULL)`

func chargeHandler(ctx context.Context, tx pgx.Tx, c charge) error {
	_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, cents) VALUES ($1, $2)`, c.OrderID, c.Cents)
	return err
}

func newConsumer(t *testing.T, inbox *dedupe.Inbox) *dedupe.Consumer[charge] {
	t.Helper()
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[charge]{
		Scope: "billing",
		Key:   func(c charge) (string, error) { return c.OrderID, nil },
	}, chargeHandler)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDeliverConcurrentDuplicatesExactlyOnce(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
	c := newConsumer(t, env.Inbox)
	dedupetest.Deliver(t, c, charge{OrderID: "o-1", Cents: 500}, 20).ExactlyOnce(t)
	env.WantCount(t, 1, `SELECT count(*) FROM charges WHERE order_id = 'o-1'`)
}

func TestFailNextCommitRetriesOnce(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
	c := newConsumer(t, env.Inbox)
	env.FailNextCommit(t)
	out, err := c.Handle(context.Background(), charge{OrderID: "o-2", Cents: 1})
	if err == nil || out == dedupe.OutcomeClaimed {
		t.Fatalf("handle with a failing commit = %v, %v", out, err)
	}
	env.WantCount(t, 0, `SELECT count(*) FROM charges`)
	d := dedupetest.UntilSettled(t, c, charge{OrderID: "o-2", Cents: 1}, 5)
	if d.Count(dedupe.OutcomeClaimed) != 1 {
		t.Fatalf("redelivery: %s", d)
	}
	env.WantCount(t, 1, `SELECT count(*) FROM charges`)
}

func TestLostCommitReplyIsNotARollback(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
	f := env.Faulty(t)
	c := newConsumer(t, f.Inbox)
	f.LoseNextCommitReply()
	out, err := c.Handle(context.Background(), charge{OrderID: "o-3", Cents: 1})
	if err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("handle with a lost commit reply = %v, %v; want claimed", out, err)
	}
	if f.CommitRepliesLost() != 1 {
		t.Fatalf("replies lost = %d, want 1", f.CommitRepliesLost())
	}
	dedupetest.Deliver(t, c, charge{OrderID: "o-3", Cents: 1}, 5)
	env.WantCount(t, 1, `SELECT count(*) FROM charges`)
}

func TestExpireLeasesLetsARetryTakeOver(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Config: dedupe.Config{Lease: time.Hour}})
	ctx := context.Background()
	key := dedupe.Key{Scope: "jobs", ID: "nightly"}
	first, err := env.Inbox.Begin(ctx, key)
	if err != nil || first.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin = %v, %v", first, err)
	}
	if n := env.ExpireLeases(t); n != 1 {
		t.Fatalf("expired %d leases, want 1", n)
	}
	second, err := env.Inbox.Begin(ctx, key)
	if err != nil || second.Outcome != dedupe.OutcomeClaimed || second.Attempt != 2 {
		t.Fatalf("retry = %+v, %v; want a takeover", second, err)
	}
	if err := env.Inbox.Complete(ctx, first, dedupe.Result{}); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("the old holder's complete = %v, want ErrLeaseLost", err)
	}
}

func TestPoisonAndClock(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{UseClock: true, Config: dedupe.Config{Lease: time.Minute},
		Setup: []string{chargesTable}})
	c := newConsumer(t, env.Inbox)
	env.Poison(t, dedupe.Key{Scope: "billing", ID: "o-4"})
	if out, err := c.Handle(context.Background(), charge{OrderID: "o-4"}); out != dedupe.OutcomePoisoned || !errors.Is(err, dedupe.ErrPoisoned) {
		t.Fatalf("poisoned key = %v, %v", out, err)
	}
	// The clock moves leases without sleeping.
	ctx := context.Background()
	key := dedupe.Key{Scope: "jobs", ID: "clocked"}
	if _, err := env.Inbox.Begin(ctx, key); err != nil {
		t.Fatal(err)
	}
	if c, _ := env.Inbox.Begin(ctx, key); c.Outcome != dedupe.OutcomeInFlight {
		t.Fatalf("within the lease = %v", c.Outcome)
	}
	env.Clock.Advance(2 * time.Minute)
	if c, _ := env.Inbox.Begin(ctx, key); c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("after the lease = %v", c.Outcome)
	}
}
