package dedupenats_test

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
)

// A billing consumer: each order is charged once, however often JetStream
// delivers it.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		log.Fatal(err)
	}
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		log.Fatal(err)
	}

	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable:   "billing",
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		log.Fatal(err)
	}

	r, err := dedupenats.New(inbox, cons, dedupenats.Config{Workers: 8}, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		var o struct {
			ID    string `json:"id"`
			Cents int64  `json:"cents"`
		}
		if err := json.Unmarshal(msg.Data(), &o); err != nil {
			return dedupe.Permanent(err) // never decodable: terminate, don't retry
		}
		_, err := tx.Exec(ctx, "INSERT INTO charges (order_id, cents) VALUES ($1, $2)", o.ID, o.Cents)
		return err // commits together with the claim; acked only after
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // until Ctrl-C
		log.Fatal(err)
	}
}

// A business key: the publisher may send the same order twice under
// different Nats-Msg-Ids (say, after a restart); the Order-Id header is the
// same, so the effects happen once.
func ExampleHeaderKey() {
	var (
		inbox *dedupe.Inbox
		cons  jetstream.Consumer
	)
	r, err := dedupenats.New(inbox, cons, dedupenats.Config{Key: dedupenats.HeaderKey("Order-Id"), Scope: "billing-v2"}, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		return nil
	})
	_, _ = r, err
}

// Metrics and traces: the inbox's Observer is told of every message the
// runner handles, and of what it did beyond the handling (a failed ack, a
// retry, a termination: dedupe.TransportEvent). The dedupeotel module has
// an OpenTelemetry Observer; this one logs the messages given up on.
func ExampleRunner_observer() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	inbox, err := dedupe.New(pool, dedupe.Config{Observer: givenUp{}})
	if err != nil {
		log.Fatal(err)
	}
	var cons jetstream.Consumer // as in ExampleNew
	r, err := dedupenats.New(inbox, cons, dedupenats.Config{}, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		// The handler finds what the runner told the Observer of its message.
		log.Printf("delivery %d of %s", dedupe.MessageInfoFrom(ctx).Delivery, msg.Subject())
		return nil
	})
	_, _ = r, err
}

// givenUp is an Observer that logs the messages a runner gave up on.
type givenUp struct{ dedupe.NopObserver }

func (givenUp) TransportEvent(_ context.Context, e dedupe.TransportEvent) {
	if e.Name == dedupe.EventTerminated {
		log.Printf("gave up on %s (%s): %v", e.Key, e.Message.Destination, e.Err)
	}
}

// Describing the durable instead of holding one: Open creates or updates it.
func ExampleOpen() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	r, err := dedupenats.Open(ctx, inbox, js, "ORDERS", jetstream.ConsumerConfig{
		Durable:       "invoicing",
		FilterSubject: "orders.paid",
		MaxDeliver:    20, // the runner terminates and records the 20th failure
	}, dedupenats.Config{Key: dedupenats.HeaderKey("Order-Id")}, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		_, err := tx.Exec(ctx, "INSERT INTO invoices (order_id) VALUES ($1)", msg.Headers().Get("Order-Id"))
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(r.Run(ctx))
}
