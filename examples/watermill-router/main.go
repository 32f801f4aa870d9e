// Command watermill-router shows dedupe inside a Watermill router: two
// routers share one in-process GoChannel Pub/Sub (each receives every
// message, as two services subscribed to one topic would in a fan-out),
// every order is published twice under its UUID, and one order's first
// attempt fails. Each router runs its handler inside dedupe's transaction
// through the dedupewatermill middleware, so each order is shipped exactly
// once, however many routers and copies saw it. It prints what happened and
// exits 1 if the shipments do not equal the orders.
//
//	go run ./examples/watermill-router [-orders 50]
//
// Swap the GoChannel for any Watermill Pub/Sub (AMQP, SQS, Kafka, Redis...)
// and nothing else changes. PostgreSQL comes from DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/test); the program works in the table
// watermill_shipments, which it creates if missing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	dedupewatermill "github.com/exactlyonce/dedupe/adapters/watermill"
	"github.com/exactlyonce/dedupe/examples/counter"
)

func main() {
	orders := flag.Int("orders", 50, "orders to publish (each twice)")
	flag.Parse()
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	if err := run(context.Background(), dsn, *orders, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "watermill-router:", err)
		os.Exit(1)
	}
}

// run publishes orders twice to two routers and checks one shipment each.
func run(ctx context.Context, dsn string, orders int, out io.Writer) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS watermill_shipments (order_id text NOT NULL, shipped_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	run := fmt.Sprintf("run-%d", time.Now().UnixNano())
	counts := counter.New()
	inbox, err := dedupe.New(pool, dedupe.Config{Observer: counts})
	if err != nil {
		return err
	}
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(4 * orders)}, logger)
	defer pubsub.Close()

	var failedOnce atomic.Bool
	ship := func(msg *message.Message) error {
		tx, ok := dedupewatermill.Tx[pgx.Tx](msg.Context())
		if !ok {
			return errors.New("no dedupe transaction")
		}
		if _, err := tx.Exec(msg.Context(), `INSERT INTO watermill_shipments (order_id) VALUES ($1)`, msg.UUID); err != nil {
			return err
		}
		if msg.UUID == run+"-order-0" && failedOnce.CompareAndSwap(false, true) {
			return errors.New("carrier unavailable") // rolled back; GoChannel redelivers
		}
		return nil
	}
	mw, err := dedupewatermill.New[pgx.Tx](inbox, dedupewatermill.Config{Scope: "watermill-shipping"})
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var routers []*message.Router
	for i := range 2 {
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		if err != nil {
			return err
		}
		r.AddMiddleware(mw.Handler)
		r.AddNoPublisherHandler(fmt.Sprintf("ship-%d", i), "orders", pubsub, ship)
		go func() { _ = r.Run(rctx) }()
		<-r.Running()
		routers = append(routers, r)
	}
	for i := range orders {
		for range 2 {
			if err := pubsub.Publish("orders", message.NewMessage(fmt.Sprintf("%s-order-%d", run, i), []byte("book"))); err != nil {
				return err
			}
		}
	}
	// Two routers × two copies: four handlings per order, plus the retry.
	want := int64(4*orders + 1)
	deadline := time.Now().Add(2 * time.Minute)
	for counts.Ended() < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for _, r := range routers {
		_ = r.Close()
	}
	var shipped int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM watermill_shipments WHERE order_id LIKE $1`, run+"-%").Scan(&shipped); err != nil {
		return err
	}
	fmt.Fprintf(out, "orders: %d, deliveries: %d (2 routers × 2 copies, 1 failed attempt)\n", orders, 4*orders+1)
	fmt.Fprintf(out, "shipped: %d, duplicates absorbed: %d, failed attempts retried: %d\n",
		shipped, counts.Handled(dedupe.OutcomeDuplicate), counts.Handled(dedupe.OutcomeRetry))
	if shipped != orders {
		return fmt.Errorf("shipped %d orders, want %d", shipped, orders)
	}
	return nil
}
