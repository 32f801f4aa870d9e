package test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// batchConfig is fastConfig in batch mode.
func batchConfig(size int) *dedupenats.Config {
	cfg := fastConfig()
	cfg.BatchSize = size
	return cfg
}

// TestBatchDuplicatesInOneBatchAndAcrossTwoRunners publishes every order
// three times before two batch-mode runners (two connections, as two
// processes) start together: copies of a key meet inside one batch and in
// the batches of both runners at once. Each order has exactly one effect,
// every copy is acknowledged, and the messages went through batches.
func TestBatchDuplicatesInOneBatchAndAcrossTwoRunners(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const orders, copies = 100, 3
	for n := range orders * copies {
		b.publish(t, fmt.Sprintf("order-%d", n%orders), "x")
	}
	_, cons2 := b.conn(t)
	c1, c2 := observetest.New(), observetest.New()
	cfg := batchConfig(50)
	cfg.Workers = 2
	r1 := newRunner(t, b.observed(t, c1), b.cons, cfg, nil)
	r2 := newRunner(t, b.observed(t, c2), cons2, cfg, nil)
	dbtest.Background(t, "runner 1", r1.Run)
	dbtest.Background(t, "runner 2", r2.Run)
	total := func() int64 { return processed(c1) + processed(c2) + duplicates(c1) + duplicates(c2) }
	c1.Wait(t, 30*time.Second, "every copy acknowledged", func() bool {
		return total() == orders*copies && b.unacked(t) == 0
	})
	if n := b.effects(t); n != orders {
		t.Fatalf("effects = %d, want %d", n, orders)
	}
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != orders {
		t.Fatalf("distinct effects = %d, want %d", n, orders)
	}
	if p := processed(c1) + processed(c2); p != orders {
		t.Fatalf("processed = %d, want %d", p, orders)
	}
	batches := c1.Events(dedupe.EventBatchHandled) + c2.Events(dedupe.EventBatchHandled)
	if batches == 0 || c1.HandledIn("batch", dedupe.OutcomeDuplicate)+c2.HandledIn("batch", dedupe.OutcomeDuplicate) == 0 {
		t.Fatalf("observed %s and %s; want duplicates found in batches", c1, c2)
	}
	for _, c := range []*observetest.Observer{c1, c2} {
		if c.Events(dedupe.EventTerminated) != 0 || c.Events(dedupe.EventAckFailed) != 0 {
			t.Fatalf("observed %s; want no termination or ack failure", c)
		}
	}
}

// TestBatchFailingMessageIsolated fails one message of a batch once: its
// attempt is recorded and it alone is handed back; the others commit once
// and are acknowledged without a retry, and the failing one commits on its
// redelivery.
func TestBatchFailingMessageIsolated(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const total = 20
	for n := range total {
		b.publish(t, fmt.Sprintf("o-%d", n), "x")
	}
	c := observetest.New()
	cfg := batchConfig(total)
	cfg.Workers = 1
	var failed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		if dedupe.ClaimFromContext(ctx).Key.ID == "o-10" && failed.CompareAndSwap(false, true) {
			return errors.New("o-10 fails once")
		}
		return nil
	}
	dbtest.Background(t, "runner", newRunner(t, b.observed(t, c), b.cons, cfg, h).Run)
	c.Wait(t, 20*time.Second, "every message acknowledged", func() bool {
		return processed(c) == total && b.unacked(t) == 0
	})
	if n := b.effects(t); n != total {
		t.Fatalf("effects = %d, want %d", n, total)
	}
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != total {
		t.Fatalf("distinct effects = %d, want %d", n, total)
	}
	// The messages behind the failing one are not attempted; they run
	// again as a batch, not one transaction each.
	if !failed.Load() || c.Events(dedupe.EventRetried) != 1 || c.Handled(dedupe.OutcomeRetry)-c.NotAttempted() != 1 ||
		duplicates(c) != 0 || c.Events(dedupe.EventBatchFallback) != 0 {
		t.Fatalf("observed %s; want one failure, one retry, no duplicate, no fallback", c)
	}
	if n := b.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'o-10' AND state = 'complete'"); n != 2 {
		t.Fatalf("o-10's attempts = %d, want 2 (its failure recorded)", n)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'complete' AND attempts = 1"); n != total-1 {
		t.Fatalf("keys complete at their first attempt = %d, want %d", n, total-1)
	}
	if c.Events(dedupe.EventBatchHandled) == 0 {
		t.Fatalf("observed %s; want batches", c)
	}
}

// TestBatchFailingMessageOnDeadConnectionPoolOfOne kills the connection of
// a batch's transaction under its second handler, which then fails: the
// failing message's attempt cannot be recorded in that transaction, and the
// message before it is handled again as a batch, which needs a connection.
// On a pool of one connection the batch's transaction must give back its
// dead one first; held, the worker waited for it forever while the
// heartbeat kept every message it held from redelivery (the nats-batch
// soak's stall: no progress, inputs without an inbox row, keys left in
// flight). Every message commits once and is acknowledged.
func TestBatchFailingMessageOnDeadConnectionPoolOfOne(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const total = 20
	for n := range total {
		b.publish(t, fmt.Sprintf("o-%d", n), "x")
	}
	c := observetest.New()
	inbox, err := dedupe.New(b.db.AppPool(t, "nats-batch-pool-of-one", 1), dedupe.Config{Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	one := *b
	one.inbox = inbox
	cfg := batchConfig(total)
	cfg.Workers = 1
	cfg.DrainTimeout = time.Second
	var (
		mu     sync.Mutex
		calls  = map[pgx.Tx]int{} // handlers run per transaction
		killed atomic.Int64
	)
	h := func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		mu.Lock()
		calls[tx]++
		second := calls[tx] == 2
		mu.Unlock()
		if !second || !killed.CompareAndSwap(0, 1) {
			return nil
		}
		// The second handler of a batch: its connection dies under it (a
		// backend terminated, a reply the network dropped), and its next
		// statement fails.
		var pid uint32
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		if _, err := b.db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		killed.Store(2) // the connection outlived its termination: the fault did not happen
		return nil
	}
	dbtest.Background(t, "runner", newRunner(t, &one, b.cons, cfg, h).Run)
	c.Wait(t, 20*time.Second, "every message acknowledged", func() bool {
		return processed(c) == total && b.unacked(t) == 0
	})
	if k := killed.Load(); k != 1 {
		t.Fatalf("connection kills = %d (2: it survived), want 1", k)
	}
	if n := b.effects(t); n != total {
		t.Fatalf("effects = %d, want %d", n, total)
	}
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != total {
		t.Fatalf("distinct effects = %d, want %d", n, total)
	}
	if duplicates(c) != 0 || c.Events(dedupe.EventTerminated) != 0 || c.Events(dedupe.EventBatchHandled) == 0 {
		t.Fatalf("observed %s; want batches, no duplicate, no termination", c)
	}
}

// TestBatchMaxDeliverRecorded runs a batch-mode runner on a consumer with
// MaxDeliver 3 and a message whose handler always fails, among others that
// succeed: the others commit once, and the failing one is recorded failed
// after three attempts at its last delivery and terminated.
func TestBatchMaxDeliverRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for n := range 9 {
		b.publish(t, fmt.Sprintf("o-%d", n), "x")
	}
	b.publish(t, "doomed", "x")
	c := observetest.New()
	cfg := batchConfig(10)
	cfg.Workers = 1
	r, err := dedupenats.Open(context.Background(), b.observed(t, c).inbox, b.js, streamName,
		jetstream.ConsumerConfig{Durable: "capped", FilterSubject: "orders.created", MaxDeliver: 3, AckWait: 2 * time.Second},
		*cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
			if err := insertEffect(ctx, tx, msg); err != nil {
				return err
			}
			if dedupe.ClaimFromContext(ctx).Key.ID == "doomed" {
				return errors.New("always fails")
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	dbtest.Background(t, "runner", r.Run)
	c.Wait(t, 20*time.Second, "the doomed message terminated, the others processed", func() bool {
		return c.Events(dedupe.EventTerminated) == 1 && processed(c) == 9
	})
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'doomed' AND state = 'failed' AND attempts = 3"); n != 1 {
		t.Fatal("the poison key was not recorded as failed after MaxDeliver attempts")
	}
	if n := b.effects(t); n != 9 {
		t.Fatalf("effects = %d, want 9 (none of the doomed one's)", n)
	}
	if c.Events(dedupe.EventRetried) != 2 || c.Handled(dedupe.OutcomePoisoned) != 1 {
		t.Fatalf("observed %s; want 2 retried, then poisoned", c)
	}
}

// countingConsumer counts the messages its fetches handed over.
type countingConsumer struct {
	jetstream.Consumer
	n *atomic.Int64
}

func (c countingConsumer) Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	mb, err := c.Consumer.Fetch(batch, opts...)
	if err != nil {
		return mb, err
	}
	out := make(chan jetstream.Msg)
	go func() { // ends when the fetch's channel closes
		defer close(out)
		for m := range mb.Messages() {
			out <- m
			c.n.Add(1)
		}
	}()
	return beforeAckBatch{MessageBatch: mb, msgs: out}, nil
}

// TestBatchShutdownMidBatch stops a batch-mode runner while a handler in
// the middle of a batch is stuck: after DrainTimeout the batch rolls back
// and every message not committed is handed back, none acknowledged; a
// second runner then processes each exactly once.
func TestBatchShutdownMidBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{ackWait: 2 * time.Minute})
	const total = 20
	for n := range total {
		b.publish(t, fmt.Sprintf("o-%d", n), "x")
	}
	var fetched atomic.Int64
	c1 := observetest.New()
	cfg := batchConfig(total)
	cfg.Workers = 1
	cfg.DrainTimeout = 100 * time.Millisecond
	var (
		mu      sync.Mutex
		first   pgx.Tx
		calls   = map[pgx.Tx]int{}
		stuckIn = make(chan int, 1) // messages handled before it in its batch
	)
	h := func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		mu.Lock()
		if first == nil {
			first = tx
		}
		calls[tx]++
		n, firstBatch := calls[tx], tx == first
		mu.Unlock()
		if firstBatch {
			// Let the runner take in every message, so that the next batch
			// is a full one.
			for fetched.Load() < total && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			return nil
		}
		if n == 5 {
			stuckIn <- n - 1
			<-ctx.Done() // stuck until the drain timeout cancels it
			return ctx.Err()
		}
		return nil
	}
	r1 := newRunner(t, b.observed(t, c1), countingConsumer{Consumer: b.cons, n: &fetched}, cfg, h)
	stop1 := dbtest.Background(t, "runner", r1.Run)
	select {
	case n := <-stuckIn:
		if n != 4 {
			t.Fatalf("stuck after %d messages of its batch, want 4", n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the handler in the middle of the second batch did not start")
	}
	stop1()
	committed := int(processed(c1))
	if committed == 0 || committed >= total {
		t.Fatalf("processed = %d before the stop; want the first batch only", committed)
	}
	if n := b.effects(t); n != committed {
		t.Fatalf("effects after shutdown = %d, want %d (the stuck batch rolled back)", n, committed)
	}
	if n := b.unacked(t); n != total-committed {
		t.Fatalf("unacked after shutdown = %d, want %d", n, total-committed)
	}
	if n := c1.Events(dedupe.EventReleased); n != int64(total-committed) {
		t.Fatalf("released = %d, want %d", n, total-committed)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != committed {
		t.Fatalf("inbox rows after shutdown = %d, want %d (a shutdown is not a failed attempt)", n, committed)
	}

	c2 := observetest.New()
	dbtest.Background(t, "runner", newRunner(t, b.observed(t, c2), b.cons, batchConfig(total), nil).Run)
	c2.Wait(t, 20*time.Second, "the rest processed by the second runner", func() bool {
		return processed(c2) == int64(total-committed) && b.unacked(t) == 0
	})
	if n := b.effects(t); n != total || duplicates(c2) != 0 {
		t.Fatalf("effects = %d, duplicates = %d; want %d and 0", n, duplicates(c2), total)
	}
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != total {
		t.Fatalf("distinct effects = %d, want %d", n, total)
	}
}
