package test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/internal/amqptest"
	"github.com/exactlyonce/dedupe/internal/observetest"
	"github.com/exactlyonce/dedupe/internal/outboxtest"
	"github.com/exactlyonce/dedupe/outbox"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestOutboxPublisherToRunner: messages committed through the outbox reach
// the queue with their outbox id as message_id, the order key and the trace
// context as headers, confirmed by the broker; a relay's re-send (it died
// after the publish, before recording it) is absorbed by the consuming
// runner, whose Observer reads the trace context back: each effect once.
func TestOutboxPublisherToRunner(t *testing.T) {
	db, ob := outboxtest.New(t)
	b := setup(t, setupOpts{db: db})
	pub, err := dedupeamqp.NewOutboxPublisher(amqptest.URL(), dedupeamqp.OutboxPublisherConfig{
		RoutingKey: func(string) string { return b.queue },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ids := outboxtest.Enqueue(t, db.Pool, ob,
		outbox.Message{Topic: "orders", Key: "o1", Payload: []byte("a"), Headers: map[string][]string{"traceparent": {traceparent}}},
		outbox.Message{Topic: "orders", Key: "o2", Payload: []byte("b")},
		outbox.Message{Topic: "orders", Payload: []byte("c")})
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if n, err := relay.Cycle(ctx); err != nil || n != 3 {
		t.Fatalf("cycle = %d, %v; want 3", n, err)
	}
	if n := amqptest.Count(t, b.conn, b.queue); n != 3 {
		t.Fatalf("queue holds %d, want 3", n)
	}
	// The relay's re-send of the first two.
	msgs := make([]*outbox.StoredMessage, 2)
	for i := range msgs {
		msgs[i] = &outbox.StoredMessage{Message: outbox.Message{ID: ids[i], Topic: "orders", Payload: []byte("again")}}
	}
	if errs := pub.Publish(ctx, msgs); errs != nil {
		t.Fatalf("re-send: %v", errs)
	}

	var mu sync.Mutex
	traces := map[string]string{}
	obs := observetest.New()
	b.inbox = observedInbox(t, b, dedupe.Observers(obs, observetest.OnHandled(func(h dedupe.HandleInfo, _ dedupe.HandleDone) {
		if h.Message.Headers != nil && h.Message.Headers.Get("traceparent") != "" {
			mu.Lock()
			traces[h.Key.ID] = h.Message.Headers.Get("traceparent")
			mu.Unlock()
		}
		if h.Message.System != "rabbitmq" || h.Message.Destination != b.queue {
			t.Errorf("message info = %+v, want system rabbitmq and the queue", h.Message)
		}
	})))
	cfg := fastConfig()
	cfg.Key = nil // DefaultKey: the message_id, the outbox id
	stop := run(t, newRunner(t, b, "", cfg, nil))
	waitFor(t, 20*time.Second, "five deliveries handled", func() bool {
		return obs.Handled(dedupe.OutcomeClaimed)+obs.Handled(dedupe.OutcomeDuplicate) >= 5
	})
	b.settled(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t); n != 3 {
		t.Fatalf("effects = %d, want 3", n)
	}
	if d := obs.Handled(dedupe.OutcomeDuplicate); d != 2 {
		t.Fatalf("duplicates = %d, want 2", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if traces[ids[0]] != traceparent {
		t.Fatalf("trace context seen by the runner's Observer = %q, want %q", traces[ids[0]], traceparent)
	}
}

// TestOutboxPublisherUnroutableParkedAfterAttempts: a message no queue
// takes is returned by the broker (mandatory flag); the publish fails with
// ErrUnroutable, not as a success, and the relay parks it after its
// attempts while the routable one is published. An unreachable broker fails
// the health check.
func TestOutboxPublisherUnroutableParkedAfterAttempts(t *testing.T) {
	db, ob := outboxtest.New(t)
	b := setup(t, setupOpts{db: db})
	pub, err := dedupeamqp.NewOutboxPublisher(amqptest.URL(), dedupeamqp.OutboxPublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ctx := context.Background()
	nowhere := amqptest.Name(t, "nowhere") // no queue of that name
	errs := pub.Publish(ctx, []*outbox.StoredMessage{
		{Message: outbox.Message{ID: "1", Topic: nowhere}},
		{Message: outbox.Message{ID: "2", Topic: b.queue}},
	})
	if len(errs) != 2 || !errors.Is(errs[0], dedupeamqp.ErrUnroutable) || dedupe.IsPermanent(errs[0]) || errs[1] != nil {
		t.Fatalf("errors = %v; want ErrUnroutable (not permanent) and nil", errs)
	}
	if n := amqptest.Count(t, b.conn, b.queue); n != 1 {
		t.Fatalf("queue holds %d, want 1", n)
	}

	outboxtest.Enqueue(t, db.Pool, ob, outbox.Message{Topic: nowhere, Payload: []byte("lost?")})
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{DisableListen: true, MaxAttempts: 2,
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the unroutable message parked", func() bool {
		if _, err := relay.Cycle(ctx); err != nil {
			t.Logf("cycle: %v", err)
		}
		return db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL") == 1
	})
	if n := db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL AND last_error LIKE '%unroutable%'"); n != 1 {
		t.Fatalf("the parked message does not say it was unroutable")
	}

	down, err := dedupeamqp.NewOutboxPublisher("amqp://guest:guest@127.0.0.1:1/", dedupeamqp.OutboxPublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := down.CheckHealth(ctx); err == nil {
		t.Fatal("health of an unreachable broker: nil error")
	}
	if errs := down.Publish(ctx, []*outbox.StoredMessage{{Message: outbox.Message{ID: "4", Topic: b.queue}}}); len(errs) != 1 || errs[0] == nil || dedupe.IsPermanent(errs[0]) {
		t.Fatalf("publish to an unreachable broker = %v; want one transient error", errs)
	}
}
