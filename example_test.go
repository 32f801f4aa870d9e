package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// exampleDB is a fresh schema on the test server; see dbtest.ForExample.
func exampleDB() (*pgxpool.Pool, func()) { return dbtest.ForExample() }

// A consumer whose broker delivers the same message three times charges the
// customer once: the claim and the charge commit in one transaction.
func ExampleConsumer_Handle() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()

	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE charges (order_id text, cents int)`)
	inbox, _ := dedupe.New(pool, dedupe.Config{})

	type OrderPlaced struct {
		ID    string
		Cents int
	}
	consumer, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[OrderPlaced]{
		Scope: "billing", // the consumer group
		Key:   func(m OrderPlaced) (string, error) { return m.ID, nil },
	}, func(ctx context.Context, tx pgx.Tx, m OrderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges VALUES ($1, $2)`, m.ID, m.Cents)
		return err
	})
	if err != nil {
		panic(err)
	}

	for range 3 { // a retry, a redelivery, a rebalance
		outcome, err := consumer.Handle(ctx, OrderPlaced{ID: "ord_1", Cents: 1900})
		fmt.Println(outcome, err)
	}
	var charges int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges)
	fmt.Println("charges:", charges)
	// Output:
	// claimed <nil>
	// duplicate <nil>
	// duplicate <nil>
	// charges: 1
}

// Claim joins a transaction the caller already has.
func ExampleInbox_Claim() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	_ = dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{})
	inbox, _ := dedupe.New(pool, dedupe.Config{})

	for range 2 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			claim, err := inbox.Claim(ctx, tx, dedupe.Key{Scope: "stripe/payments", ID: "evt_1NG8Du2eZvKYlo2C"})
			if err != nil {
				return err
			}
			fmt.Println(claim.Outcome)
			if claim.Outcome != dedupe.OutcomeClaimed {
				return nil
			}
			// ... the event's writes through tx ...
			return nil
		})
		if err != nil {
			panic(err)
		}
	}
	// Output:
	// claimed
	// duplicate
}

// Leased mode for work outside the database: the claim commits first, the
// external call carries a derived Idempotency-Key, and the result is stored.
func ExampleInbox_Begin() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	_ = dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{})
	inbox, _ := dedupe.New(pool, dedupe.Config{Lease: time.Minute})

	key := dedupe.Key{Scope: "airflow/billing", ID: "monthly_invoices/send/scheduled__2026-11-30"}
	claim, err := inbox.Begin(ctx, key)
	if err != nil {
		panic(err)
	}
	switch claim.Outcome {
	case dedupe.OutcomeClaimed:
		downstreamKey := claim.DerivedKey("send-email") // the same on every retry
		_ = downstreamKey                               // send as Idempotency-Key
		if err := inbox.Complete(ctx, claim, dedupe.Result{Status: 0, Body: []byte("sent 42 invoices")}); err != nil {
			panic(err)
		}
		fmt.Println("ran")
	case dedupe.OutcomeDuplicate:
		fmt.Println("already done:", string(claim.Result.Body))
	}

	again, _ := inbox.Begin(ctx, key)
	fmt.Println(again.Outcome, string(again.Result.Body))

	// Completing the same claim again (a retry after a lost reply) succeeds
	// and keeps the stored result; only a stale holder is refused.
	err = inbox.Complete(ctx, claim, dedupe.Result{})
	fmt.Println(err == nil, errors.Is(err, dedupe.ErrLeaseLost))
	// Output:
	// ran
	// duplicate sent 42 invoices
	// true false
}
