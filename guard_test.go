package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestHandlerRollbackStatementIsNotSuccess: a handler that ends the claim's
// transaction with a ROLLBACK statement and returns nil must not make Handle
// report the message processed (before, it did, with nothing committed, so
// every redelivery ran the effects again). Statements it sends after the
// ROLLBACK are refused instead of running outside any transaction, and the
// key is marked failed at once: a redelivery does not run it again.
func TestHandlerRollbackStatementIsNotSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var afterEnd error
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{MaxAttempts: 2}, func(ctx context.Context, tx pgx.Tx, o order) error {
		if err := insertEffect(ctx, tx, o); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "ROLLBACK"); err != nil {
			return err
		}
		afterEnd = insertEffect(ctx, tx, o) // would autocommit an effect without its claim
		return nil
	})
	ctx := context.Background()
	out, err := c.Handle(ctx, order{ID: "o-rb"})
	if out != dedupe.OutcomePoisoned || !errors.Is(err, dedupe.ErrTxEnded) || !errors.Is(err, dedupe.ErrPoisoned) {
		t.Fatalf("handle = %v, %v; want poisoned, matching ErrTxEnded", out, err)
	}
	if !errors.Is(afterEnd, dedupe.ErrTxEnded) {
		t.Fatalf("statement after the ROLLBACK = %v, want refused with ErrTxEnded", afterEnd)
	}
	if got := b.effects(t, "o-rb"); got != 0 {
		t.Fatalf("effects = %d, want 0", got)
	}
	out, err = c.Handle(ctx, order{ID: "o-rb"})
	if out != dedupe.OutcomePoisoned || !errors.Is(err, dedupe.ErrPoisoned) {
		t.Fatalf("redelivery = %v, %v; want poisoned", out, err)
	}
}

// TestHandlerEndingItsTransactionOnAPoolOfOneConnection: a handler that
// ends the claim's transaction with a statement, on a pool of one
// connection. Handle records the key on a connection of its own, and
// waited for its context's end before (found by review: the ended
// transaction kept the only connection until Handle returned). A COMMIT
// statement committed the claim with the effect: the redelivery is a
// duplicate. After a ROLLBACK statement the key is marked failed: the
// redelivery is a settled failure and does not run the handler (what a
// statement that ended the transaction wrote after the end, in the same
// simple query, would commit again). Over the direct claim round and over
// pgx's batch (a tracer).
func TestHandlerEndingItsTransactionOnAPoolOfOneConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		stmt     string
		effects  int
		again    dedupe.Outcome
		againErr error
	}{{"COMMIT", 1, dedupe.OutcomeDuplicate, nil}, {"ROLLBACK", 0, dedupe.OutcomePoisoned, dedupe.ErrPoisoned}} {
		for _, traced := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/traced=%v", tc.stmt, traced), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				pool := directPool(t, b, 1, func(c *pgxpool.Config) {
					if traced {
						c.ConnConfig.Tracer = dbtest.NopTracer{}
					}
				})
				var end atomic.Bool
				end.Store(true)
				c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
					func(ctx context.Context, tx pgx.Tx, o order) error {
						if err := insertEffect(ctx, tx, o); err != nil {
							return err
						}
						if end.Load() {
							_, err := tx.Exec(ctx, tc.stmt)
							return err
						}
						return nil
					})
				if err != nil {
					t.Fatal(err)
				}
				// A bound for lack of progress only: a round trip or two.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				out, err := c.Handle(ctx, order{ID: "k"})
				if ctx.Err() != nil || !errors.Is(err, dedupe.ErrTxEnded) {
					t.Fatalf("handle = %v, %v (context: %v); want ErrTxEnded at once", out, err, ctx.Err())
				}
				if got := b.effects(t, "k"); got != tc.effects {
					t.Fatalf("effects = %d, want %d", got, tc.effects)
				}
				end.Store(false)
				if out, err := c.Handle(ctx, order{ID: "k"}); out != tc.again || tc.againErr == nil && err != nil || !errors.Is(err, tc.againErr) {
					t.Fatalf("redelivery = %v, %v; want %v, %v", out, err, tc.again, tc.againErr)
				}
				if got := b.effects(t, "k"); got != tc.effects {
					t.Fatalf("effects after the redelivery = %d, want %d", got, tc.effects)
				}
			})
		}
	}
}

// TestHandlerCannotCommitOrRollBack: Commit and Rollback on the handler's
// transaction are refused with ErrTxOwned; the claim and the effects commit
// when the handler returns nil. Before, a handler's Rollback ended the claim's
// transaction and the message was redelivered forever.
func TestHandlerCannotCommitOrRollBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var commitErr, rollbackErr error
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		if err := insertEffect(ctx, tx, o); err != nil {
			return err
		}
		commitErr = tx.Commit(ctx)
		rollbackErr = tx.Rollback(ctx)
		return nil
	})
	out, err := c.Handle(context.Background(), order{ID: "o-own"})
	if err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("handle = %v, %v", out, err)
	}
	if !errors.Is(commitErr, dedupe.ErrTxOwned) || !errors.Is(rollbackErr, dedupe.ErrTxOwned) {
		t.Fatalf("commit = %v, rollback = %v; want ErrTxOwned", commitErr, rollbackErr)
	}
	if got := b.effects(t, "o-own"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// TestHandlerIgnoringAFailedStatementFails: a handler that swallows a failed
// statement leaves the transaction aborted; returning nil must not be
// reported as processed.
func TestHandlerIgnoringAFailedStatementFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		_, _ = tx.Exec(ctx, "SELECT 1/0")
		return nil
	})
	out, err := c.Handle(context.Background(), order{ID: "o-div"})
	if out != dedupe.OutcomeRetry || !errors.Is(err, dedupe.ErrTxEnded) {
		t.Fatalf("handle = %v, %v; want retry with ErrTxEnded", out, err)
	}
	rec, err := b.inbox.Lookup(context.Background(), dedupe.Key{Scope: "orders", ID: "o-div"})
	if err != nil || rec.State != dedupe.StateInFlight || rec.Attempts != 1 {
		t.Fatalf("record = %+v, %v; want the attempt counted, key released", rec, err)
	}
}

// TestHandlerSavepointsStillWork: a handler may use savepoints (pgx's
// nested transactions) inside the claim's transaction.
func TestHandlerSavepointsStillWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := insertEffect(ctx, sp, order{ID: o.ID + "-undone"}); err != nil {
			return err
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		return insertEffect(ctx, tx, o)
	})
	if out, err := c.Handle(context.Background(), order{ID: "o-sp"}); err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("handle = %v, %v", out, err)
	}
	if b.effects(t, "o-sp") != 1 || b.effects(t, "o-sp-undone") != 0 {
		t.Fatal("savepoint inside the handler did not behave")
	}
}

// TestHandleOwnKeyFromHandlerIsRefused: a handler that calls Handle (or
// Begin) for the key it is handling would wait on its own uncommitted claim
// forever; it gets ErrReentrant at once. Before, it deadlocked.
func TestHandleOwnKeyFromHandlerIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var inner, innerBegin error
	var c *dedupe.Consumer[order]
	c = newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		if o.ID != "o-re" {
			return insertEffect(ctx, tx, o) // the child
		}
		_, inner = c.Handle(ctx, o)
		_, innerBegin = b.inbox.Begin(ctx, dedupe.Key{Scope: "orders", ID: o.ID})
		// Another key is fine.
		if _, err := c.Handle(ctx, order{ID: o.ID + "-child"}); err != nil {
			return err
		}
		return insertEffect(ctx, tx, o)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := c.Handle(ctx, order{ID: "o-re"}); err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("handle = %v, %v", out, err)
	}
	if !errors.Is(inner, dedupe.ErrReentrant) || !errors.Is(innerBegin, dedupe.ErrReentrant) {
		t.Fatalf("inner handle = %v, begin = %v; want ErrReentrant", inner, innerBegin)
	}
	if b.effects(t, "o-re") != 1 || b.effects(t, "o-re-child") != 1 {
		t.Fatal("effects missing")
	}
}

// TestAttemptLimitExactUnderConcurrency: with MaxAttempts 3, waves of
// concurrent deliveries of one failing message run the handler exactly 3
// times; then the key is failed. Before, the handler ran 3 to 9 times,
// because a failed attempt was counted only after its claim was released.
func TestAttemptLimitExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const maxAttempts = 3
	for k := range 5 {
		id := "o-fail-" + string(rune('a'+k))
		var runs atomic.Int64
		c := newConsumer(t, b, dedupe.ConsumerConfig[order]{MaxAttempts: maxAttempts}, func(ctx context.Context, tx pgx.Tx, o order) error {
			runs.Add(1)
			if err := insertEffect(ctx, tx, o); err != nil {
				return err
			}
			return errors.New("always fails")
		})
		for wave := 0; wave < 4; wave++ {
			together(12, func(int) { _, _ = c.Handle(context.Background(), order{ID: id}) })
		}
		if got := runs.Load(); got != maxAttempts {
			t.Errorf("%s: handler ran %d times, want exactly %d", id, got, maxAttempts)
		}
		rec, err := b.inbox.Lookup(context.Background(), dedupe.Key{Scope: "orders", ID: id})
		if err != nil || rec.State != dedupe.StateFailed || rec.Attempts != maxAttempts {
			t.Errorf("%s: record = %+v, %v; want failed after %d attempts", id, rec, err, maxAttempts)
		}
		if got := b.effects(t, id); got != 0 {
			t.Errorf("%s: effects = %d, want 0", id, got)
		}
	}
}
