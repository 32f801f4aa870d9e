package dedupetest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/dedupetest"
)

// The shape of a handler test: copies delivered at once, a commit that
// fails and its redelivery, each followed by the effects counted and the
// key's record checked. t is your test's *testing.T.
func Example() {
	var t *testing.T // your test's

	env := dedupetest.New(t, dedupetest.Options{Setup: []string{
		`CREATE TABLE charges (order_id text NOT NULL, cents int NOT NULL)`,
	}})
	consumer, err := dedupe.NewConsumer(env.Inbox, dedupe.ConsumerConfig[charge]{
		Scope: "billing",
		Key:   func(c charge) (string, error) { return c.OrderID, nil },
	}, func(ctx context.Context, tx pgx.Tx, c charge) error {
		// Through tx, never env.Pool: the charge commits with its claim.
		_, err := tx.Exec(ctx, `INSERT INTO charges VALUES ($1, $2)`, c.OrderID, c.Cents)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := charge{OrderID: "o-1", Cents: 500}

	dedupetest.Deliver(t, consumer, msg, 20).ExactlyOnce(t) // 20 copies at once: one claimed, 19 duplicates
	env.WantCount(t, 1, `SELECT count(*) FROM charges WHERE order_id = $1`, msg.OrderID)
	env.RequireKey(t, dedupe.Key{Scope: "billing", ID: msg.OrderID}, dedupetest.KeyWant{State: dedupe.StateComplete, Attempts: 1})

	retried := charge{OrderID: "o-2", Cents: 700}
	env.FailNextCommit(t)                            // its first commit fails after the handler ran...
	dedupetest.UntilSettled(t, consumer, retried, 5) // ...and the redelivery commits
	env.WantCount(t, 1, `SELECT count(*) FROM charges WHERE order_id = $1`, retried.OrderID)
	env.RequireState(t, dedupe.Key{Scope: "billing", ID: retried.OrderID}, dedupe.StateComplete)
}
