package test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// TestLastDeliveryFoundCompleteIsReportedDuplicate: a message at its last
// delivery whose handling was cancelled (the runner stopping) while a
// concurrent copy of its key committed: settling it finds the key complete
// and acknowledges it. Handle reports it as a duplicate, and so is it
// reported to the Observer: every message ends visibly (a settled handling,
// EventTerminated, or a hand-back event). The pause before A commits only
// makes the interesting order likely; the assertions hold in any order.
func TestLastDeliveryFoundCompleteIsReportedDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{ackWait: 30 * time.Second})
	cons := b.consumer(t, jetstream.ConsumerConfig{Durable: "once", MaxDeliver: 1, AckWait: 30 * time.Second})
	b.publish(t, "order-1", "a")
	b.publish(t, "order-1", "b") // a second copy of the same key

	c := observetest.New()
	entered := make(chan struct{})
	release := make(chan struct{})
	var first atomic.Bool
	r := newRunner(t, b.observed(t, c), cons, fastConfig(), func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release // hold the claim's row lock
		}
		return nil
	})

	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 2 {
		t.Fatalf("fetched %d, want 2", len(msgs))
	}

	type result struct {
		o   dedupe.Outcome
		err error
	}
	resA := make(chan result, 1)
	go func() {
		o, err := r.Handle(context.Background(), msgs[0])
		resA <- result{o, err}
	}()
	<-entered

	// B waits on A's claim, then its runner stops (context cancelled).
	ctxB, cancelB := context.WithCancel(context.Background())
	resB := make(chan result, 1)
	go func() {
		o, err := r.Handle(ctxB, msgs[1])
		resB <- result{o, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for b.db.Count(t, "SELECT count(*) FROM pg_locks WHERE NOT granted") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("B never waited on A's claim")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancelB()
	time.Sleep(200 * time.Millisecond) // likely: B is in settle, recording the key failed (blocked on A)
	close(release)

	a, bb := <-resA, <-resB
	t.Logf("A: %v %v; B: %v %v; observed %s", a.o, a.err, bb.o, bb.err, c)
	if a.err != nil || a.o != dedupe.OutcomeClaimed {
		t.Fatalf("A = %v, %v", a.o, a.err)
	}
	if bb.err != nil || bb.o != dedupe.OutcomeDuplicate {
		t.Fatalf("B = %v, %v; want a duplicate", bb.o, bb.err)
	}
	if n := b.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	if n := unackedOf(t, cons); n != 0 {
		t.Fatalf("unacked = %d, want 0", n)
	}
	// Two messages, each must end visibly to the Observer.
	ends := c.Handled(dedupe.OutcomeClaimed) + c.Handled(dedupe.OutcomeDuplicate) +
		c.Events(dedupe.EventTerminated) + c.Events(dedupe.EventRetried) +
		c.Events(dedupe.EventReleased) + c.Events(dedupe.EventAckFailed)
	if ends != 2 {
		t.Fatalf("messages ended visibly = %d, want 2 (B was acked without a report): %s", ends, c)
	}
}
