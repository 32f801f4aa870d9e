// Package demo is the quickstart's program logic, apart from its main so
// that examples/telemetry runs the same demo with OpenTelemetry turned on:
// an in-process NATS server with JetStream, orders placed with deliberate
// duplicates through the transactional outbox and its relay, several
// concurrent consumers while some first attempts fail and one consumer
// loses its connection, and a report of deliveries against effects.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/examples/counter"
	"github.com/exactlyonce/dedupe/examples/embedded"
	"github.com/exactlyonce/dedupe/examples/exampledb"
	"github.com/exactlyonce/dedupe/outbox"
)

const (
	streamName  = "ORDERS"
	durableName = "shipping"
	orderIDHdr  = "Order-Id"
)

// Options configure one quickstart run.
type Options struct {
	Orders    int     // unique orders
	DupRate   float64 // extra duplicates per unique order
	FailRate  float64 // orders whose first attempt fails
	Consumers int     // consumer processes
	Workers   int     // workers per consumer
	CrashOne  bool    // close one consumer's NATS connection mid-run

	DatabaseURL    string
	DatabaseSource string // for the report
	// Schema is the schema the run creates and works in. Defaults to
	// dedupe_quickstart_ and 8 random hex digits (NewSchemaName).
	Schema string
	// KeepSchema leaves the schema and its tables in place at the end, to
	// look at them; by default Run drops it.
	KeepSchema bool
	Logger     *slog.Logger
	Timeout    time.Duration // Defaults to 60s.

	// Observer is told what the inbox, the outbox and the relay do (the
	// OpenTelemetry one in main). Defaults to none.
	Observer Observer
	// Place wraps each order's placement, the request in whose transaction
	// the order is enqueued in the outbox: it returns the context to
	// enqueue in (examples/telemetry starts a "place order" span there)
	// and a function to call once it is done. Defaults to none.
	Place func(ctx context.Context, orderID string) (context.Context, func())
}

// Observer is told what the inbox and the outbox do: the hooks of both, as
// the OpenTelemetry Observer implements them.
type Observer interface {
	dedupe.Observer
	outbox.Observer
}

// Report is what a run came to.
type Report struct {
	DatabaseSource, Schema string
	SchemaKept             bool
	Consumers, Workers     int
	Crashed                int // index of the consumer that lost its connection, or -1

	Unique, Published, Deliveries, Duplicates, Retries int64
	Effects, DistinctEffects                           int64
	Elapsed                                            time.Duration
}

// NewSchemaName returns a fresh name for a run's schema.
func NewSchemaName() string { return exampledb.SchemaName("quickstart") }

// OK reports whether the effects equal the unique orders, each written once.
func (r *Report) OK() bool { return r.Effects == r.Unique && r.DistinctEffects == r.Unique }

// order is the message body.
type order struct {
	ID   string `json:"id"`
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

// Run does the whole quickstart against o.DatabaseURL in a fresh schema,
// which it drops before returning.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Orders < 1 || o.Consumers < 1 || o.Workers < 1 {
		return nil, errors.New("orders, consumers and workers must be at least 1")
	}
	if o.Schema == "" {
		o.Schema = NewSchemaName()
	}
	rep := &Report{DatabaseSource: o.DatabaseSource, Consumers: o.Consumers, Workers: o.Workers, Crashed: -1,
		Schema: o.Schema, SchemaKept: o.KeepSchema}

	// PostgreSQL: a schema of our own, dropped at the end.
	pcfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pcfg.MaxConns = 8
	pcfg.ConnConfig.RuntimeParams["search_path"] = rep.Schema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{rep.Schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	defer func() {
		if o.KeepSchema {
			return
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{rep.Schema}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintf(os.Stderr, "quickstart: drop schema %s: %v\n", rep.Schema, err)
		}
	}()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (
		id bigserial PRIMARY KEY, order_id text NOT NULL, item text NOT NULL, qty int NOT NULL)`); err != nil {
		return nil, err
	}
	// The inbox's Observer is told of every delivery handled and of what
	// the runners did beyond it; counts keeps the report's figures.
	counts := counter.New()
	inbox, err := dedupe.New(pool, dedupe.Config{Logger: o.Logger, Observer: dedupe.Observers(o.Observer, counts)})
	if err != nil {
		return nil, err
	}

	// NATS with JetStream, in-process, storing in a temporary directory;
	// its own connection publishes the orders.
	ns, err := embedded.NATS("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	pubConn, err := nats.Connect(ns.URL())
	if err != nil {
		return nil, err
	}
	defer pubConn.Close()
	js, err := jetstream.New(pubConn)
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{"orders.>"}}); err != nil {
		return nil, err
	}
	durable, err := js.CreateOrUpdateConsumer(ctx, streamName, jetstream.ConsumerConfig{
		Durable: durableName, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second,
	})
	if err != nil {
		return nil, err
	}

	// Which orders fail on their first attempt (a flaky warehouse API).
	rng := rand.New(rand.NewPCG(42, uint64(o.Orders)))
	flaky := map[string]bool{}
	var orders []order
	for n := range o.Orders {
		ord := order{ID: fmt.Sprintf("order-%04d", n+1), Item: []string{"book", "lamp", "mug"}[n%3], Qty: 1 + n%4}
		orders = append(orders, ord)
		if rng.Float64() < o.FailRate {
			flaky[ord.ID] = true
		}
	}
	handler := func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		var ord order
		if err := json.Unmarshal(msg.Data(), &ord); err != nil {
			return dedupe.Permanent(err)
		}
		if flaky[ord.ID] && dedupe.ClaimFromContext(ctx).Attempt == 1 {
			return errors.New("warehouse API timed out")
		}
		_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, item, qty) VALUES ($1, $2, $3)", ord.ID, ord.Item, ord.Qty)
		return err
	}

	// The consumers: each its own connection, as separate processes would be.
	runCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var wg sync.WaitGroup
	errs := make([]error, o.Consumers)
	for i := range o.Consumers {
		nc, err := nats.Connect(ns.URL())
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		cjs, err := jetstream.New(nc)
		if err != nil {
			return nil, err
		}
		cons, err := cjs.Consumer(ctx, streamName, durableName)
		if err != nil {
			return nil, err
		}
		h := handler
		crashes := o.CrashOne && o.Consumers > 1 && i == o.Consumers-1
		if crashes {
			// Lose the connection after a few messages: the acks of the
			// messages in flight fail (their effects commit all the same),
			// and JetStream redelivers them after AckWait.
			rep.Crashed = i
			var handled atomic.Int64
			after := int64(max(o.Orders/(3*o.Consumers), 1))
			h = func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
				if handled.Add(1) == after {
					nc.Close()
				}
				return handler(ctx, tx, msg)
			}
		}
		r, err := dedupenats.New(inbox, cons, dedupenats.Config{
			Key:     dedupenats.HeaderKey(orderIDHdr),
			Workers: o.Workers,
			Backoff: dedupe.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}.Delay,
			Logger:  o.Logger,
		}, h)
		if err != nil {
			return nil, err
		}
		wg.Go(func() {
			err := r.Run(runCtx)
			if crashes && errors.Is(err, dedupenats.ErrIteratorClosed) {
				err = nil // the connection we closed on purpose
			}
			errs[i] = err
		})
	}

	// Place every order once and some again (a client that retried),
	// each copy enqueued in the outbox in its own transaction and published
	// by the relay under its own Nats-Msg-Id.
	start := time.Now()
	msgs := make([]order, 0, o.Orders*2)
	msgs = append(msgs, orders...)
	for range int(float64(o.Orders) * o.DupRate) {
		at := rng.IntN(len(orders))
		msgs = append(msgs, orders[at])
	}
	if err := publishThroughOutbox(ctx, o, pool, js, msgs); err != nil {
		return nil, err
	}
	rep.Unique, rep.Published = int64(len(orders)), int64(len(msgs))

	// Wait until the durable has nothing pending and nothing unacknowledged.
	deadline := time.Now().Add(o.Timeout)
	for {
		ci, err := durable.Info(ctx)
		if err != nil {
			return nil, err
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not drained after %v: %d pending, %d unacknowledged", o.Timeout, ci.NumPending, ci.NumAckPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rep.Elapsed = time.Since(start)
	stopAll()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	rep.Duplicates = counts.Handled(dedupe.OutcomeDuplicate)
	rep.Retries = counts.Events(dedupe.EventRetried)
	rep.Deliveries = counts.Ended()
	if err := pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT order_id) FROM shipments").
		Scan(&rep.Effects, &rep.DistinctEffects); err != nil {
		return nil, err
	}
	return rep, nil
}
