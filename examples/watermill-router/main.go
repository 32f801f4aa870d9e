// Command watermill-router shows dedupe inside a Watermill router: two
// routers share one in-process GoChannel Pub/Sub (each receives every
// message, as two services subscribed to one topic would in a fan-out),
// every order is published twice under its UUID, and one order's first
// attempt fails. Each router runs its handler inside dedupe's transaction
// through the dedupewatermill middleware, so each order is shipped exactly
// once, however many routers and copies saw it. It prints what happened and
// exits 1 if the shipments do not equal the orders, 2 if PostgreSQL cannot
// be reached or the run fails.
//
//	go run ./examples/watermill-router [-orders 50] [-keep-schema]
//
// Swap the GoChannel for any Watermill Pub/Sub (AMQP, SQS, Kafka, Redis...)
// and nothing else changes. PostgreSQL is found through -database-url, else
// DATABASE_URL, else at postgres://postgres@127.0.0.1:5432/test. The
// program works in a schema of its own (its table watermill_shipments and
// dedupe's) and drops it when it ends, unless -keep-schema.
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
	"github.com/exactlyonce/dedupe/examples/exampledb"
)

func main() {
	fs := flag.NewFlagSet("watermill-router", flag.ExitOnError)
	url := exampledb.Flag(fs, os.Getenv)
	orders := fs.Int("orders", 50, "orders to publish (each twice)")
	var keep bool
	exampledb.KeepSchemaVar(fs, &keep)
	_ = fs.Parse(os.Args[1:])
	ctx := context.Background()
	if err := exampledb.Check(ctx, *url); err != nil {
		fmt.Fprintln(os.Stderr, "watermill-router:", err)
		os.Exit(2)
	}
	o := options{URL: *url, Orders: *orders, Schema: exampledb.SchemaName("watermill-router"), KeepSchema: keep}
	end := "dropped at exit"
	if o.KeepSchema {
		end = "kept at exit"
	}
	fmt.Printf("PostgreSQL: %s (schema %s, %s)\n", exampledb.Source(*url, os.Getenv), o.Schema, end)
	shipped, err := run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "watermill-router:", err)
		os.Exit(2)
	}
	if o.KeepSchema {
		fmt.Printf("tables kept in schema %s: watermill_shipments, dedupe_inbox, dedupe_outbox, dedupe_migration (DROP SCHEMA %s CASCADE when done)\n", o.Schema, o.Schema)
	}
	if shipped != o.Orders {
		fmt.Fprintf(os.Stderr, "watermill-router: shipped %d orders, want %d\n", shipped, o.Orders)
		os.Exit(1)
	}
}

// options are what one run does, and where.
type options struct {
	URL        string // the server (its search_path is replaced by Schema)
	Orders     int
	Schema     string // created at start
	KeepSchema bool   // leave Schema and its tables at exit
}

// run publishes o.Orders orders twice to two routers, in the schema
// o.Schema of its own, which it drops at the end unless o.KeepSchema, and
// returns how many were shipped.
func run(ctx context.Context, o options, out io.Writer) (int, error) {
	orders := o.Orders
	pcfg, err := pgxpool.ParseConfig(o.URL)
	if err != nil {
		return 0, fmt.Errorf("database URL: %w", err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = o.Schema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	schema := pgx.Identifier{o.Schema}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return 0, fmt.Errorf("create schema: %w", err)
	}
	if !o.KeepSchema {
		defer func() {
			if _, err := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
				fmt.Fprintf(os.Stderr, "watermill-router: drop schema %s: %v\n", o.Schema, err)
			}
		}()
	}
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		return 0, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE watermill_shipments (order_id text NOT NULL, shipped_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, err
	}
	counts := counter.New()
	inbox, err := dedupe.New(pool, dedupe.Config{Observer: counts})
	if err != nil {
		return 0, err
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
		if msg.UUID == "order-0" && failedOnce.CompareAndSwap(false, true) {
			return errors.New("carrier unavailable") // rolled back; GoChannel redelivers
		}
		return nil
	}
	mw, err := dedupewatermill.New[pgx.Tx](inbox, dedupewatermill.Config{Scope: "watermill-shipping"})
	if err != nil {
		return 0, err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var routers []*message.Router
	for i := range 2 {
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		if err != nil {
			return 0, err
		}
		r.AddMiddleware(mw.Handler)
		r.AddNoPublisherHandler(fmt.Sprintf("ship-%d", i), "orders", pubsub, ship)
		go func() { _ = r.Run(rctx) }()
		<-r.Running()
		routers = append(routers, r)
	}
	for i := range orders {
		for range 2 {
			if err := pubsub.Publish("orders", message.NewMessage(fmt.Sprintf("order-%d", i), []byte("book"))); err != nil {
				return 0, err
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
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM watermill_shipments`).Scan(&shipped); err != nil {
		return 0, err
	}
	fmt.Fprintf(out, "orders: %d, deliveries: %d (2 routers × 2 copies, 1 failed attempt)\n", orders, 4*orders+1)
	fmt.Fprintf(out, "shipped: %d, duplicates absorbed: %d, failed attempts retried: %d\n",
		shipped, counts.Handled(dedupe.OutcomeDuplicate), counts.Handled(dedupe.OutcomeRetry))
	return shipped, nil
}
