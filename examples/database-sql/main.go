// Command database-sql shows dedupe in an application built on database/sql:
// its handler receives a *sql.Tx and writes through an sqlc-style data layer
// (package payments), and every order is delivered several times at the
// same instant. It prints how many deliveries there were and how many
// charges were written: exactly one per order.
//
//	go run ./examples/database-sql [-orders 50] [-copies 4] [-keep-schema]
//
// It uses database/sql over pgx's stdlib (driver "pgx"); lib/pq (driver
// "postgres") works the same way. PostgreSQL is found through
// -database-url, else DATABASE_URL, else at
// postgres://postgres@127.0.0.1:5432/test. The example works in a schema of
// its own and drops it when it ends, unless -keep-schema. It exits 1 if the
// charges do not equal the orders, 2 if PostgreSQL cannot be reached or the
// run fails.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/examples/database-sql/payments"
	"github.com/exactlyonce/dedupe/examples/exampledb"
)

// Order is the message: an order to charge.
type Order struct {
	ID    string
	Cents int64
}

func main() {
	fs := flag.NewFlagSet("database-sql", flag.ExitOnError)
	url := exampledb.Flag(fs, os.Getenv)
	orders := fs.Int("orders", 50, "unique orders")
	copies := fs.Int("copies", 4, "deliveries of each order, all at the same instant")
	var keep bool
	exampledb.KeepSchemaVar(fs, &keep)
	_ = fs.Parse(os.Args[1:])
	ctx := context.Background()
	if err := exampledb.Check(ctx, *url); err != nil {
		fmt.Fprintln(os.Stderr, "database-sql:", err)
		os.Exit(2)
	}
	o := options{URL: *url, Orders: *orders, Copies: *copies, KeepSchema: keep, Schema: exampledb.SchemaName("database-sql")}
	fmt.Printf("dedupe over database/sql (pgx stdlib), handler in a *sql.Tx\n")
	printWhere(os.Stdout, exampledb.Source(*url, os.Getenv), o)
	rep, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "database-sql:", err)
		os.Exit(2)
	}
	fmt.Printf("  orders              %5d\n", rep.orders)
	fmt.Printf("  deliveries          %5d   (%d copies of each, at once)\n", rep.deliveries, o.Copies)
	fmt.Printf("  claimed             %5d\n", rep.claimed)
	fmt.Printf("  duplicates absorbed %5d\n", rep.duplicates)
	verdict := "== orders: exactly once"
	if !rep.ok() {
		verdict = fmt.Sprintf("!= orders (%d distinct): MISMATCH", rep.distinct)
	}
	fmt.Printf("  charges written     %5d   %s\n", rep.charges, verdict)
	if o.KeepSchema {
		fmt.Printf("\n  tables kept in schema %s: charges, dedupe_inbox, dedupe_outbox, dedupe_migration (DROP SCHEMA %s CASCADE when done)\n", o.Schema, o.Schema)
	}
	if !rep.ok() {
		os.Exit(1)
	}
}

// options are what one run does, and where.
type options struct {
	URL            string // the server (its search_path is replaced by Schema)
	Orders, Copies int
	Schema         string // created at start
	KeepSchema     bool   // leave Schema and its tables at exit
}

// printWhere writes where the run works, before it starts.
func printWhere(w io.Writer, source string, o options) {
	end := "dropped at exit"
	if o.KeepSchema {
		end = "kept at exit"
	}
	fmt.Fprintf(w, "  PostgreSQL          %s (schema %s, %s)\n", source, o.Schema, end)
}

type report struct {
	orders, deliveries, claimed, duplicates int
	charges, distinct                       int64
}

func (r report) ok() bool { return r.charges == int64(r.orders) && r.distinct == int64(r.orders) }

// run delivers o.Copies copies of each of o.Orders orders at once to one
// consumer and counts what was written, in the schema o.Schema of its own
// on the server of o.URL, which it drops at the end unless o.KeepSchema.
func run(ctx context.Context, o options) (report, error) {
	n, copies := o.Orders, o.Copies
	rep := report{orders: n, deliveries: n * copies}
	dsn, err := exampledb.InSchema(o.URL, o.Schema)
	if err != nil {
		return rep, err
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return rep, err
	}
	defer db.Close()
	// database/sql opens a connection per concurrent call unless told
	// otherwise: bound it, as a pgx pool is, below the server's
	// max_connections (every delivery below runs at once).
	db.SetMaxOpenConns(8)
	schema := pgx.Identifier{o.Schema}.Sanitize()
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return rep, fmt.Errorf("create schema: %w", err)
	}
	if !o.KeepSchema {
		defer func() {
			if _, err := db.ExecContext(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
				fmt.Fprintf(os.Stderr, "database-sql: drop schema %s: %v\n", o.Schema, err)
			}
		}()
	}

	// The one line that differs from pgx: wrap the *sql.DB.
	sqldb := dedupe.SQL(db)
	if err := dedupe.Migrate(ctx, sqldb, dedupe.MigrateConfig{}); err != nil {
		return rep, err
	}
	if _, err := db.ExecContext(ctx, payments.Schema); err != nil {
		return rep, err
	}
	inbox, err := dedupe.New(sqldb, dedupe.Config{})
	if err != nil {
		return rep, err
	}
	consumer, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[Order]{
		Scope: "billing",
		Key:   func(o Order) (string, error) { return o.ID, nil },
	}, func(ctx context.Context, tx *sql.Tx, o Order) error {
		// The claim is already in tx: the charge commits with it or not at all.
		return payments.New(tx).InsertCharge(ctx, payments.InsertChargeParams{OrderID: o.ID, Cents: o.Cents})
	})
	if err != nil {
		return rep, err
	}

	var claimed, dup atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n*copies)
	start := make(chan struct{})
	for i := range n * copies {
		wg.Go(func() {
			<-start
			order := Order{ID: fmt.Sprintf("order-%04d", i%n), Cents: 1299}
			switch out, err := consumer.Handle(ctx, order); {
			case err != nil:
				errs <- err
			case out == dedupe.OutcomeClaimed:
				claimed.Add(1)
			case out == dedupe.OutcomeDuplicate:
				dup.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if err := errors.Join(all...); err != nil {
		return rep, err
	}
	rep.claimed, rep.duplicates = int(claimed.Load()), int(dup.Load())
	rep.charges, rep.distinct, err = payments.New(db).CountCharges(ctx)
	return rep, err
}
