package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

func newBatchConsumer(t *testing.T, b *bundle, cfg dedupe.ConsumerConfig[order], h dedupe.HandlerFunc[order]) *dedupe.BatchConsumer[order] {
	t.Helper()
	if cfg.Scope == "" {
		cfg.Scope = "orders"
	}
	if cfg.Key == nil {
		cfg.Key = orderKey
	}
	if h == nil {
		h = insertEffect
	}
	c, err := dedupe.NewBatchConsumer(b.inbox, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func outcomes(res []dedupe.BatchResult) []dedupe.Outcome {
	out := make([]dedupe.Outcome, len(res))
	for n, r := range res {
		out[n] = r.Outcome
	}
	return out
}

func TestHandleBatchOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := newBatchConsumer(t, b, dedupe.ConsumerConfig[order]{}, nil)
	if res := c.HandleBatch(ctx, []order{{ID: "b-1"}}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	res := c.HandleBatch(ctx, []order{{ID: "b-1"}, {ID: "b-2"}, {ID: "b-2"}, {ID: ""}, {ID: "b-3"}})
	want := []dedupe.Outcome{dedupe.OutcomeDuplicate, dedupe.OutcomeClaimed, dedupe.OutcomeDuplicate, 0, dedupe.OutcomeClaimed}
	if fmt.Sprint(outcomes(res)) != fmt.Sprint(want) {
		t.Fatalf("outcomes = %v, want %v", outcomes(res), want)
	}
	if !errors.Is(res[3].Err, dedupe.ErrInvalidKey) {
		t.Fatalf("empty key = %v, want ErrInvalidKey", res[3].Err)
	}
	for _, id := range []string{"b-1", "b-2", "b-3"} {
		if got := b.effects(t, id); got != 1 {
			t.Errorf("effects of %s = %d, want 1", id, got)
		}
	}
}

// TestHandleBatchFailureOnDeadConnectionPoolOfOne: the connection of a
// batch's transaction dies under its second handler, which fails, so its
// attempt cannot be recorded; the first message is then handled again as a
// batch. On a pool of one connection that batch gets a connection only once
// the failed transaction has given back its dead one; HandleBatch used to
// wait for it forever. The first message commits, the second is left to its
// redelivery (its failure unrecorded) and the third is not attempted.
func TestHandleBatchFailureOnDeadConnectionPoolOfOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inbox, err := dedupe.New(b.db.AppPool(t, "victim-"+b.db.Schema, 1), dedupe.Config{Clock: b.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	var killed atomic.Bool
	c, err := dedupe.NewBatchConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
		func(ctx context.Context, tx pgx.Tx, o order) error {
			if err := insertEffect(ctx, tx, o); err != nil {
				return err
			}
			if o.ID != "p-2" || !killed.CompareAndSwap(false, true) {
				return nil
			}
			var pid uint32
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			if _, err := b.db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT 1") // the connection is gone
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan []dedupe.BatchResult, 1)
	go func() { done <- c.HandleBatch(ctx, []order{{ID: "p-1"}, {ID: "p-2"}, {ID: "p-3"}}) }()
	var res []dedupe.BatchResult
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatal("HandleBatch made no progress for 30s: the batch after the failure waits for the pool's only connection")
	}
	if !killed.Load() {
		t.Fatal("p-2's handler did not run")
	}
	if res[0].Outcome != dedupe.OutcomeClaimed || res[0].Err != nil {
		t.Fatalf("p-1 = %v, %v; want claimed", res[0].Outcome, res[0].Err)
	}
	if he, ok := errors.AsType[*dedupe.HandlerError](res[1].Err); !ok || he.Recorded {
		t.Fatalf("p-2 = %v, %v; want a handler failure, unrecorded", res[1].Outcome, res[1].Err)
	}
	if !errors.Is(res[2].Err, dedupe.ErrNotAttempted) {
		t.Fatalf("p-3 = %v, %v; want not attempted", res[2].Outcome, res[2].Err)
	}
	for id, want := range map[string]int{"p-1": 1, "p-2": 0, "p-3": 0} {
		if got := b.effects(t, id); got != want {
			t.Errorf("effects of %s = %d, want %d", id, got, want)
		}
	}
}

// TestHandleBatchConcurrentOverlapExactlyOnce: batches that share keys,
// fired at once, write each key's effect exactly once.
func TestHandleBatchConcurrentOverlapExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newBatchConsumer(t, b, dedupe.ConsumerConfig[order]{TxRetries: 10}, nil)
	const workers, keys = 8, 60
	together(workers, func(w int) {
		batch := make([]order, 0, keys)
		for k := range keys {
			batch = append(batch, order{ID: fmt.Sprintf("k-%d", (k+w*7)%keys)})
		}
		for _, r := range c.HandleBatch(context.Background(), batch) {
			if r.Err != nil {
				t.Errorf("batch: %v", r.Err)
			}
		}
	})
	if got := b.db.Count(t, `SELECT count(*) FROM effects`); got != keys {
		t.Fatalf("effects = %d, want %d", got, keys)
	}
	if got := b.db.Count(t, `SELECT count(DISTINCT msg_key) FROM effects`); got != keys {
		t.Fatalf("distinct effects = %d, want %d", got, keys)
	}
}

// TestHandleBatchPoisonMessageCountedExactly: one message of every batch
// always fails. The others commit in the same transaction; the failing one
// runs exactly MaxAttempts times over concurrent redeliveries of the batch
// and ends failed.
func TestHandleBatchPoisonMessageCountedExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var poisonRuns atomic.Int64
	const maxAttempts = 3
	c := newBatchConsumer(t, b, dedupe.ConsumerConfig[order]{MaxAttempts: maxAttempts}, func(ctx context.Context, tx pgx.Tx, o order) error {
		if err := insertEffect(ctx, tx, o); err != nil {
			return err
		}
		if o.ID == "poison" {
			poisonRuns.Add(1)
			return errors.New("cannot parse")
		}
		return nil
	})
	batch := []order{{ID: "p-1"}, {ID: "p-2"}, {ID: "poison"}, {ID: "p-3"}}
	for range 3 {
		together(6, func(int) {
			res := c.HandleBatch(context.Background(), batch)
			// Order is kept: what follows a failing message is not attempted.
			var he *dedupe.HandlerError
			if errors.As(res[2].Err, &he) && !errors.Is(res[3].Err, dedupe.ErrNotAttempted) {
				t.Errorf("after the failing message: %v, %v", res[3].Outcome, res[3].Err)
			}
		})
	}
	if res := c.HandleBatch(context.Background(), batch[3:]); res[0].Err != nil {
		t.Fatalf("p-3 on its own: %v", res[0].Err)
	}
	if got := poisonRuns.Load(); got != maxAttempts {
		t.Fatalf("poison ran %d times, want exactly %d", got, maxAttempts)
	}
	for _, id := range []string{"p-1", "p-2", "p-3"} {
		if got := b.effects(t, id); got != 1 {
			t.Errorf("effects of %s = %d, want 1", id, got)
		}
	}
	if got := b.effects(t, "poison"); got != 0 {
		t.Fatalf("poison effects = %d, want 0", got)
	}
	rec, err := b.inbox.Lookup(context.Background(), dedupe.Key{Scope: "orders", ID: "poison"})
	if err != nil || rec.State != dedupe.StateFailed || rec.Attempts != maxAttempts {
		t.Fatalf("poison record = %+v, %v", rec, err)
	}
	res := c.HandleBatch(context.Background(), batch)
	want := []dedupe.Outcome{dedupe.OutcomeDuplicate, dedupe.OutcomeDuplicate, dedupe.OutcomePoisoned, dedupe.OutcomeDuplicate}
	if fmt.Sprint(outcomes(res)) != fmt.Sprint(want) || !errors.Is(res[2].Err, dedupe.ErrPoisoned) {
		t.Fatalf("after poison = %v (%v), want %v", outcomes(res), res[2].Err, want)
	}
}

// TestHandleBatchFuncFailureFallsBackPerMessage: a batch handler that fails
// because of one message; the batch is handled one message at a time and
// only that message fails.
func TestHandleBatchFuncFailureFallsBackPerMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := dedupe.NewBatchConsumerFunc(b.inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
		func(ctx context.Context, tx pgx.Tx, os []order) error {
			for _, o := range os {
				if o.ID == "bad" {
					return errors.New("bad row")
				}
				if err := insertEffect(ctx, tx, o); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	res := c.HandleBatch(context.Background(), []order{{ID: "f-1"}, {ID: "bad"}, {ID: "f-2"}})
	want := []dedupe.Outcome{dedupe.OutcomeClaimed, dedupe.OutcomeRetry, dedupe.OutcomeRetry}
	if fmt.Sprint(outcomes(res)) != fmt.Sprint(want) {
		t.Fatalf("outcomes = %v, want %v (%v)", outcomes(res), want, res)
	}
	var he *dedupe.HandlerError
	if !errors.As(res[1].Err, &he) || he.Attempt != 1 {
		t.Fatalf("bad message error = %v", res[1].Err)
	}
	if !errors.Is(res[2].Err, dedupe.ErrNotAttempted) {
		t.Fatalf("after the failing message = %v, want ErrNotAttempted", res[2].Err)
	}
	if b.effects(t, "f-1") != 1 || b.effects(t, "f-2") != 0 || b.effects(t, "bad") != 0 {
		t.Fatal("effects wrong")
	}
	if res := c.HandleBatch(context.Background(), []order{{ID: "f-2"}}); res[0].Err != nil || b.effects(t, "f-2") != 1 {
		t.Fatalf("f-2 delivered again = %v", res[0].Err)
	}
}

// TestHandleBatchLostCommitReplyResolved: the batch's COMMIT reply is lost;
// every message is reported processed, once.
func TestHandleBatchLostCommitReplyResolved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, _ := faultyPool(t, b, pgproxy.Once(pgproxy.DropReply, pgproxy.IsCommit))
	c, err := dedupe.NewBatchConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	res := c.HandleBatch(context.Background(), []order{{ID: "l-1"}, {ID: "l-2"}})
	for n, r := range res {
		if r.Err != nil || r.Outcome != dedupe.OutcomeClaimed {
			t.Fatalf("res[%d] = %v, %v; want claimed", n, r.Outcome, r.Err)
		}
	}
	if b.effects(t, "l-1") != 1 || b.effects(t, "l-2") != 1 {
		t.Fatal("effects wrong")
	}
}

// TestHandleBatchGuardsTheTransaction: a handler that ends the batch's
// transaction is not reported as processed.
func TestHandleBatchGuardsTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newBatchConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		if err := insertEffect(ctx, tx, o); err != nil {
			return err
		}
		if o.ID == "rogue" {
			_, err := tx.Exec(ctx, "COMMIT")
			return err
		}
		return nil
	})
	res := c.HandleBatch(context.Background(), []order{{ID: "g-1"}, {ID: "rogue"}, {ID: "g-2"}})
	if res[1].Err == nil || res[1].Outcome == dedupe.OutcomeClaimed || !errors.Is(res[1].Err, dedupe.ErrTxEnded) {
		t.Fatalf("rogue = %v, %v; want a failure", res[1].Outcome, res[1].Err)
	}
	if res[0].Err != nil || !errors.Is(res[2].Err, dedupe.ErrNotAttempted) {
		t.Fatalf("the others = %v, %v", res[0].Err, res[2].Err)
	}
	// g-2's claim went along with the rogue COMMIT and was released: it is
	// processed when delivered again, not dropped as a duplicate.
	if res := c.HandleBatch(context.Background(), []order{{ID: "g-2"}}); res[0].Err != nil || res[0].Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("g-2 again = %v, %v", res[0].Outcome, res[0].Err)
	}
	if b.effects(t, "g-1") != 1 || b.effects(t, "g-2") != 1 {
		t.Fatalf("effects of the good messages: %d, %d (%v)", b.effects(t, "g-1"), b.effects(t, "g-2"), res)
	}
}
