package dedupeamqp_test

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
)

// A consumer of the orders queue that ships each order once, however often
// RabbitMQ delivers it: the Order-Id header is the key, and the shipment row
// commits in the transaction that claims it. The queue is a quorum queue
// with a dead-letter exchange and an x-delivery-limit the runner knows
// (Config.DeliveryLimit), so no message leaves unrecorded.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		log.Fatal(err)
	}
	inbox, err := dedupe.New(pool, dedupe.Config{MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	r, err := dedupeamqp.New(inbox, "amqp://guest:guest@127.0.0.1:5672/", "orders", dedupeamqp.Config{
		Key:           dedupeamqp.HeaderKey("Order-Id"),
		Workers:       8,
		DeliveryLimit: 20, // the queue's x-delivery-limit
	}, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		var o struct {
			ID   string `json:"id"`
			Item string `json:"item"`
			Qty  int    `json:"qty"`
		}
		if err := json.Unmarshal(d.Body, &o); err != nil {
			return dedupe.Permanent(err) // never retried: dead-lettered
		}
		_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, item, qty) VALUES ($1, $2, $3)", o.ID, o.Item, o.Qty)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Run reconnects by itself; on SIGTERM it drains and returns nil.
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
