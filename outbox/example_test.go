package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// An order and its "order placed" event commit together: the event is
// published only if the order exists, and the order never exists without its
// event. A relay publishes what committed; here it prints instead of sending
// to a broker (see adapters/nats and adapters/kafka for real publishers).
func ExampleOutbox_Enqueue() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		panic(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1')`); err != nil {
			return err
		}
		_, err := ob.Enqueue(ctx, tx, outbox.Message{ID: "order-placed-o-1", Topic: "orders.placed", Key: "o-1",
			Payload: []byte(`{"order":"o-1"}`)})
		return err
	})
	if err != nil {
		panic(err)
	}

	printer := outbox.PublishFunc(func(ctx context.Context, m *outbox.StoredMessage) error {
		fmt.Printf("publish %s to %s: %s\n", m.ID, m.Topic, m.Payload)
		return nil
	})
	relay, err := outbox.NewRelay(ob, printer, outbox.RelayConfig{})
	if err != nil {
		panic(err)
	}
	// Run(ctx) loops until cancelled; one cycle shows the effect.
	n, err := relay.Cycle(ctx)
	fmt.Println(n, err)
	n, err = relay.Cycle(ctx)
	fmt.Println(n, err)
	// Output:
	// publish order-placed-o-1 to orders.placed: {"order":"o-1"}
	// 1 <nil>
	// 0 <nil>
}

// A relay runs next to the service until shutdown; several may run at once.
func ExampleRelay_Run() {
	ctx, cancel := context.WithCancel(context.Background())
	pool, cleanup := exampleDB()
	defer cleanup()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		panic(err)
	}
	ob, _ := outbox.New(pool, outbox.Config{})
	published := make(chan string)
	pub := outbox.PublishFunc(func(ctx context.Context, m *outbox.StoredMessage) error {
		published <- string(m.Payload)
		return nil
	})
	relay, _ := outbox.NewRelay(ob, pub, outbox.RelayConfig{})
	done := make(chan error)
	go func() { done <- relay.Run(ctx) }()

	// Any transaction that commits wakes the relay through LISTEN/NOTIFY.
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "greetings", Payload: []byte("hello")})
		return err
	})
	fmt.Println(<-published)
	cancel()
	fmt.Println(<-done)
	// Output:
	// hello
	// <nil>
}

// A message the broker refuses for good is parked and holds back the later
// messages of its key; an operator who decides it must never go out
// discards it, with who and why, and the key moves on.
func ExampleOutbox_Discard() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		panic(err)
	}
	ob, _ := outbox.New(pool, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, p := range []string{"v1 schema", "second"} {
			if _, err := ob.Enqueue(ctx, tx, outbox.Message{ID: p, Topic: "orders", Key: "o-1", Payload: []byte(p)}); err != nil {
				return err
			}
		}
		return nil
	})
	pub := outbox.PublishFunc(func(ctx context.Context, m *outbox.StoredMessage) error {
		if string(m.Payload) == "v1 schema" {
			return dedupe.Permanent(errors.New("schema v1 is gone"))
		}
		fmt.Println("published", m.ID)
		return nil
	})
	relay, _ := outbox.NewRelay(ob, pub, outbox.RelayConfig{Logger: slog.New(slog.DiscardHandler)})
	_, _ = relay.Cycle(ctx) // parks "v1 schema"; "second" waits behind it

	parked, _ := ob.Parked(ctx, 10)
	fmt.Println("parked:", parked[0].ID, "-", parked[0].LastError)
	d, err := ob.Discard(ctx, parked[0].ID, "alice", "INC-7: replaced by a v2 event")
	fmt.Println("discarded:", d.ID, "by", d.DiscardedBy, err)
	_, _ = relay.Cycle(ctx)
	// Output:
	// parked: v1 schema - dedupe: permanent: schema v1 is gone
	// discarded: v1 schema by alice <nil>
	// published second
}
