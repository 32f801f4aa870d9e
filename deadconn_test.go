package dedupe_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// TestDeadConnectionOnPoolOfOneMakesProgress: the connection of a claim's
// transaction dies under p-2's handler, which then fails or returns nil.
// Whatever path that takes (the failure record refused, the COMMIT
// refused or resolved, the batch handled again or one message at a time),
// the transaction must give its dead connection back before anything else
// wants one: on a pool of one connection, a path that held it while it
// recorded, resolved or handled more would wait forever. Every driver
// (pgx, database/sql) and mode (Consumer, BatchConsumer with a per-message
// or a batch handler); after one redelivery each message's effect is
// committed exactly once. Before 18f4ba3 four of these twelve stalled (the
// per-message batch handler's, on both drivers, failing or returning nil);
// its own test covered one.
func TestDeadConnectionOnPoolOfOneMakesProgress(t *testing.T) {
	t.Parallel()
	for _, drv := range []string{"pgx", "sql"} {
		for _, mode := range []string{"consumer", "batch-each", "batch-all"} {
			for _, ret := range []string{"fails", "returns-nil"} {
				t.Run(drv+"/"+mode+"/"+ret, func(t *testing.T) {
					t.Parallel()
					deadConnPoolOfOne(t, drv, mode, ret == "fails")
				})
			}
		}
	}
}

func deadConnPoolOfOne(t *testing.T, drv, mode string, fail bool) {
	b := setup(t)
	var db dedupe.DB
	if drv == "pgx" {
		db = b.db.AppPool(t, "victim-"+b.db.Schema, 1)
	} else {
		sdb, err := sql.Open("pgx", b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sdb.Close() })
		sdb.SetMaxOpenConns(1)
		db = dedupe.SQL(sdb)
	}
	inbox := newInbox(t, db, b)

	// kill terminates the backend of the connection that pid is read on,
	// once, waits until it is gone, then runs one more statement on it.
	var killed atomic.Bool
	kill := func(ctx context.Context, id string, row func(string) interface{ Scan(...any) error }) error {
		if id != "p-2" || !killed.CompareAndSwap(false, true) {
			return nil
		}
		var pid uint32
		if err := row("SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		if _, err := b.db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			return err
		}
		for gone := false; !gone; { // paced by the backend's exit
			if err := b.db.Pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&gone); err != nil {
				return err
			}
			if !gone {
				time.Sleep(10 * time.Millisecond)
			}
		}
		var one int
		err := row("SELECT 1").Scan(&one)
		if err == nil {
			return errors.New("a statement on the dead connection succeeded")
		}
		if fail {
			return err
		}
		return nil
	}
	pgxEach := func(ctx context.Context, tx pgx.Tx, o order) error {
		if err := insertEffect(ctx, tx, o); err != nil {
			return err
		}
		return kill(ctx, o.ID, func(q string) interface{ Scan(...any) error } { return tx.QueryRow(ctx, q) })
	}
	sqlEach := func(ctx context.Context, tx *sql.Tx, o order) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", o.ID); err != nil {
			return err
		}
		return kill(ctx, o.ID, func(q string) interface{ Scan(...any) error } { return tx.QueryRowContext(ctx, q) })
	}
	cfg := dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}
	msgs := []order{{ID: "p-1"}, {ID: "p-2"}, {ID: "p-3"}}

	// handle handles msgs once and returns each one's error.
	var handle func(ctx context.Context) []error
	var err error
	if mode == "consumer" {
		var c *dedupe.Consumer[order]
		if drv == "pgx" {
			c, err = dedupe.NewConsumer(inbox, cfg, pgxEach)
		} else {
			c, err = dedupe.NewConsumer(inbox, cfg, sqlEach)
		}
		handle = func(ctx context.Context) []error {
			errs := make([]error, len(msgs))
			for n, m := range msgs {
				_, errs[n] = c.Handle(ctx, m)
			}
			return errs
		}
	} else {
		var c *dedupe.BatchConsumer[order]
		switch {
		case mode == "batch-each" && drv == "pgx":
			c, err = dedupe.NewBatchConsumer(inbox, cfg, pgxEach)
		case mode == "batch-each":
			c, err = dedupe.NewBatchConsumer(inbox, cfg, sqlEach)
		case drv == "pgx":
			c, err = dedupe.NewBatchConsumerFunc(inbox, cfg, func(ctx context.Context, tx pgx.Tx, os []order) error {
				return forEach(os, func(o order) error { return pgxEach(ctx, tx, o) })
			})
		default:
			c, err = dedupe.NewBatchConsumerFunc(inbox, cfg, func(ctx context.Context, tx *sql.Tx, os []order) error {
				return forEach(os, func(o order) error { return sqlEach(ctx, tx, o) })
			})
		}
		handle = func(ctx context.Context) []error {
			var errs []error
			for _, r := range c.HandleBatch(ctx, msgs) {
				errs = append(errs, r.Err)
			}
			return errs
		}
	}
	if err != nil {
		t.Fatal(err)
	}

	// Two deliveries of the batch: the first meets the dead connection, the
	// second is the redelivery of whatever did not commit. Each must return
	// within a no-progress bound.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var last []error
	for pass := 1; pass <= 2; pass++ {
		done := make(chan []error, 1)
		go func() { done <- handle(ctx) }()
		select {
		case last = <-done:
		case <-time.After(30 * time.Second):
			cancel()
			t.Fatalf("delivery %d made no progress for 30s (a transaction held the pool's only connection?): %v", pass, <-done)
		}
		t.Logf("delivery %d: %v", pass, last)
	}
	if !killed.Load() {
		t.Fatal("p-2's handler did not run")
	}
	for n, err := range last {
		if err != nil {
			t.Errorf("redelivery of %s: %v", msgs[n].ID, err)
		}
	}
	for _, m := range msgs {
		if got := b.effects(t, m.ID); got != 1 {
			t.Errorf("effects of %s = %d, want 1", m.ID, got)
		}
	}
}

// forEach calls f for each of os, up to the first error.
func forEach(os []order, f func(order) error) error {
	for _, o := range os {
		if err := f(o); err != nil {
			return fmt.Errorf("%s: %w", o.ID, err)
		}
	}
	return nil
}
