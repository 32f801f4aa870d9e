// Command database-sql shows dedupe in an application built on database/sql:
// its handler receives a *sql.Tx and writes through an sqlc-style data layer
// (package payments), and every order is delivered several times at the
// same instant. It prints how many deliveries there were and how many
// charges were written: exactly one per order.
//
//	go run ./examples/database-sql [-orders 50] [-copies 4]
//
// It uses database/sql over pgx's stdlib (driver "pgx"); lib/pq (driver
// "postgres") works the same way. PostgreSQL is found through DATABASE_URL,
// else at postgres://postgres@127.0.0.1:5432/test. The example works in a
// schema of its own and drops it when it ends. It exits 1 if the charges do
// not equal the orders.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/examples/database-sql/payments"
)

// localURL is tried when DATABASE_URL is not set.
const localURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Order is the message: an order to charge.
type Order struct {
	ID    string
	Cents int64
}

func main() {
	orders := flag.Int("orders", 50, "unique orders")
	copies := flag.Int("copies", 4, "deliveries of each order, all at the same instant")
	flag.Parse()
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		base = localURL
	}
	rep, err := run(context.Background(), base, *orders, *copies)
	if err != nil {
		fmt.Fprintln(os.Stderr, "database-sql:", err)
		os.Exit(2)
	}
	fmt.Printf("dedupe over database/sql (pgx stdlib), handler in a *sql.Tx\n")
	fmt.Printf("  orders              %5d\n", rep.orders)
	fmt.Printf("  deliveries          %5d   (%d copies of each, at once)\n", rep.deliveries, *copies)
	fmt.Printf("  claimed             %5d\n", rep.claimed)
	fmt.Printf("  duplicates absorbed %5d\n", rep.duplicates)
	verdict := "== orders: exactly once"
	if !rep.ok() {
		verdict = fmt.Sprintf("!= orders (%d distinct): MISMATCH", rep.distinct)
	}
	fmt.Printf("  charges written     %5d   %s\n", rep.charges, verdict)
	if !rep.ok() {
		os.Exit(1)
	}
}

type report struct {
	orders, deliveries, claimed, duplicates int
	charges, distinct                       int64
}

func (r report) ok() bool { return r.charges == int64(r.orders) && r.distinct == int64(r.orders) }

// run delivers copies of each of n orders at once to one consumer and
// counts what was written, in a schema of its own on the server of base.
func run(ctx context.Context, base string, n, copies int) (report, error) {
	rep := report{orders: n, deliveries: n * copies}
	schema, dsn, err := ownSchema(base)
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
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return rep, fmt.Errorf("create schema: %w", err)
	}
	defer db.ExecContext(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck // best effort

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
			o := Order{ID: fmt.Sprintf("order-%04d", i%n), Cents: 1299}
			switch out, err := consumer.Handle(ctx, o); {
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

// ownSchema returns a fresh schema name and base with its search_path set
// to it.
func ownSchema(base string) (schema, dsn string, err error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema = "dedupe_sql_example_" + hex.EncodeToString(b)
	u, err := url.Parse(base)
	if err != nil {
		return "", "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return schema, u.String(), nil
}
