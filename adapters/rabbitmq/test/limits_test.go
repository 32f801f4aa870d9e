package test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe/internal/amqptest"
)

// spendDeliveries takes the queue's next message n times and requeues it
// each time, as runners that stopped or lost their channel would have: it
// spends n of its deliveries without an attempt.
func (b *bundle) spendDeliveries(t *testing.T, n int) {
	t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	for i := range n {
		var d amqp.Delivery
		waitFor(t, 10*time.Second, "the message", func() bool {
			var ok bool
			d, ok, err = ch.Get(b.queue, false)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		})
		if err := d.Nack(false, true); err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
	}
}

// TestDeliveryLimitHandlerFailureAtLastDeliveryRecorded: a quorum queue with
// x-delivery-limit 2 whose message already spent two deliveries (shutdowns)
// reaches the runner at its last delivery with attempts left in the inbox.
// The handler's failure there is recorded failed and the message
// dead-lettered by the runner; without Config.DeliveryLimit the runner
// would requeue it and the broker would drop it with the inbox still
// showing it retryable.
func TestDeliveryLimitHandlerFailureAtLastDeliveryRecorded(t *testing.T) {
	b := setup(t, setupOpts{quorum: true, deliveryLimit: 2})
	b.publish(t, "o-1", "x")
	b.spendDeliveries(t, 2)
	cfg := fastConfig()
	cfg.DeliveryLimit = 2
	var calls atomic.Int64
	stop := run(t, newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		calls.Add(1)
		return errors.New("transient")
	}))
	waitFor(t, 20*time.Second, "the dead-letter copy", func() bool { return amqptest.Count(t, b.conn, b.dlq) == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'o-1' AND state = 'failed' AND attempts = 1"); n != 1 {
		t.Fatalf("o-1 is not recorded failed after its one attempt at the last delivery")
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
	d := amqptest.Drain(t, b.conn, b.dlq)[0]
	if d.Headers["x-first-death-reason"] != "rejected" {
		t.Fatalf("dead-lettered with reason %v, want rejected (by the runner, not the broker's delivery_limit)", d.Headers["x-first-death-reason"])
	}
}

// TestDeliveryLimitStopAtLastDeliveryRecordsFailed: a runner stopped while
// the handler of a message at its last delivery runs (past DrainTimeout)
// does not hand it back, which would drop it: it records the key failed
// with ErrLastDelivery and dead-letters it.
func TestDeliveryLimitStopAtLastDeliveryRecordsFailed(t *testing.T) {
	b := setup(t, setupOpts{quorum: true, deliveryLimit: 1})
	b.publish(t, "o-1", "x")
	b.spendDeliveries(t, 1)
	cfg := fastConfig()
	cfg.DeliveryLimit = 1
	cfg.DrainTimeout = 50 * time.Millisecond
	started := make(chan struct{}, 1)
	stop := run(t, newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}))
	<-started
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'o-1' AND state = 'failed' AND last_error LIKE '%last delivery%'"); n != 1 {
		t.Fatalf("o-1 is not recorded failed with ErrLastDelivery")
	}
	waitFor(t, 10*time.Second, "the dead-letter copy", func() bool { return amqptest.Count(t, b.conn, b.dlq) == 1 })
	if n := amqptest.Count(t, b.conn, b.queue); n != 0 {
		t.Fatalf("%d messages in the queue, want 0", n)
	}
}

// TestDeliveryLimitMaxAttemptsDecides: with an x-delivery-limit above the
// attempts, a message that keeps failing is poisoned by the inbox's limit
// (attempts = MaxAttempts), not dropped by the broker.
func TestDeliveryLimitMaxAttemptsDecides(t *testing.T) {
	b := setup(t, setupOpts{quorum: true, deliveryLimit: 10})
	cfg := fastConfig()
	cfg.DeliveryLimit = 10
	cfg.MaxAttempts = 3
	stop := run(t, newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		return errors.New("always")
	}))
	b.publish(t, "o-1", "x")
	waitFor(t, 20*time.Second, "the dead-letter copy", func() bool { return amqptest.Count(t, b.conn, b.dlq) == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'o-1' AND state = 'failed' AND attempts = 3"); n != 1 {
		t.Fatalf("o-1 is not recorded failed after 3 attempts")
	}
}
