package test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe/internal/amqptest"
)

// TestLastDeliveryWaitingForWorkerSurvivesCut: a quorum queue with
// x-delivery-limit 1 and no dead-letter exchange; two messages each at their
// last delivery reach a runner with one worker. The first one's handler
// runs; the second waits for the worker, in the runner's hands. The
// connection is cut: the broker drops both (their delivery limit is
// exceeded), so the runner is the only holder of their bodies. It keeps
// handling the first after the cut (the broker will not deliver it again),
// and it must do the same for the second rather than drop it unrecorded:
// both end with one effect.
func TestLastDeliveryWaitingForWorkerSurvivesCut(t *testing.T) {
	b := setup(t, setupOpts{quorum: true, deliveryLimit: 1, noDLX: true})
	b.publish(t, "o-1", "x")
	b.publish(t, "o-2", "x")
	// Spend one delivery of each (as a runner that lost its channel would).
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var got []amqp.Delivery
	waitFor(t, 10*time.Second, "both messages", func() bool {
		d, ok, err := ch.Get(b.queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got = append(got, d)
		}
		return len(got) == 2
	})
	for _, d := range got {
		if err := d.Nack(false, true); err != nil {
			t.Fatal(err)
		}
	}
	_ = ch.Close()

	proxy := amqptest.NewProxy(t)
	cfg := fastConfig()
	cfg.Workers = 1
	cfg.DeliveryLimit = 1
	started := make(chan struct{}, 2)
	release := make(chan struct{})
	var calls atomic.Int64
	stop := run(t, newRunner(t, b, proxy.URL(), cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if calls.Add(1) == 1 {
			started <- struct{}{}
			<-release
		}
		return insertEffect(ctx, tx, d)
	}))
	<-started
	// Both were delivered to the runner: the second waits for the worker.
	waitFor(t, 10*time.Second, "both messages delivered", func() bool { return amqptest.Count(t, b.conn, b.queue) == 0 })
	// The runner's reader takes the second from the client library at once;
	// nothing outside shows it, so this waits a generous moment.
	time.Sleep(300 * time.Millisecond)
	proxy.Cut()
	close(release)
	waitFor(t, 20*time.Second, "both effects", func() bool { return b.effects(t) == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t); n != 2 {
		t.Fatalf("effects = %d, want 2", n)
	}
}
