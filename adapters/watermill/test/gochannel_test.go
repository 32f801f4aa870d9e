package test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/exactlyonce/dedupe"
	dedupewatermill "github.com/exactlyonce/dedupe/adapters/watermill"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
	"github.com/exactlyonce/dedupe/outbox"
)

func goChannel(t *testing.T) *gochannel.GoChannel {
	t.Helper()
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, wmLogger(t))
	t.Cleanup(func() { _ = pubsub.Close() })
	return pubsub
}

// Two routers on one GoChannel each receive every message (GoChannel fans
// out), and each message is also published twice under its UUID, all at
// once: four handlings per message at the same time, one effect.
func TestGoChannelDuplicatesAcrossTwoRouters(t *testing.T) {
	obs := observetest.New()
	e := setup(t, obs)
	pubsub := goChannel(t)
	for range 2 {
		router(t, newMiddleware(t, e, dedupewatermill.Config{}), pubsub, "orders", noPublish(insertEffect), nil, "")
	}
	const n = 50
	dbtest.Together(2, func(int) {
		for i := range n {
			if err := pubsub.Publish("orders", message.NewMessage(fmt.Sprintf("order-%d", i), []byte("ship"))); err != nil {
				t.Error(err)
			}
		}
	})
	obs.Wait(t, 20*time.Second, "200 handlings", func() bool {
		return obs.Handled(dedupe.OutcomeClaimed)+obs.Handled(dedupe.OutcomeDuplicate) >= 4*n
	})
	if got := e.effects(t); got != n {
		t.Fatalf("effects = %d, want %d", got, n)
	}
	if c, d := obs.Handled(dedupe.OutcomeClaimed), obs.Handled(dedupe.OutcomeDuplicate); c != n || d != 3*n {
		t.Fatalf("claimed %d, duplicates %d; want %d and %d", c, d, n, 3*n)
	}
}

// A handler that fails twice is nacked twice (GoChannel redelivers) and
// commits once on the third try; its failed attempts wrote nothing.
func TestFailingHandlerNackedThenOnce(t *testing.T) {
	e := setup(t, nil)
	pubsub := goChannel(t)
	var calls atomic.Int64
	router(t, newMiddleware(t, e, dedupewatermill.Config{}), pubsub, "orders", noPublish(func(msg *message.Message) error {
		if err := insertEffect(msg); err != nil {
			return err
		}
		if calls.Add(1) <= 2 {
			return errors.New("transient")
		}
		return nil
	}), nil, "")
	if err := pubsub.Publish("orders", message.NewMessage("flaky", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	dbtest.WaitFor(t, 20*time.Second, "the effect", func() bool { return e.effects(t) == 1 })
	if n := e.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'flaky' AND state = 'complete'"); n != 3 {
		t.Fatalf("attempts = %d, want 3", n)
	}
	time.Sleep(100 * time.Millisecond)
	if got := e.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// Poison goes to Watermill's poison queue (PoisonQueueWithFilter with
// IsPoison) once its key is recorded failed: a message failing every
// attempt, one failing permanently, one without a usable key. The others
// flow, and a transient failure is not sent there.
func TestPoisonQueueCompatible(t *testing.T) {
	e := setup(t, nil)
	pubsub := goChannel(t)
	poisoned, err := pubsub.Subscribe(context.Background(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	pq, err := middleware.PoisonQueueWithFilter(pubsub, "poison", dedupewatermill.IsPoison)
	if err != nil {
		t.Fatal(err)
	}
	mw := newMiddleware(t, e, dedupewatermill.Config{MaxAttempts: 3, ReturnPoison: true, Key: dedupewatermill.MetadataKey("order_id")})
	var flaky atomic.Int64
	router(t, mw, pubsub, "orders", noPublish(func(msg *message.Message) error {
		switch msg.Metadata.Get("order_id") {
		case "fails":
			return errors.New("cannot decode")
		case "permanent":
			return dedupe.Permanent(errors.New("unknown product"))
		case "flaky":
			if flaky.Add(1) == 1 {
				return errors.New("transient")
			}
		}
		return insertEffect(msg)
	}), nil, "", pq)
	publish := func(uuid, orderID string) {
		m := message.NewMessage(uuid, []byte("x"))
		if orderID != "" {
			m.Metadata.Set("order_id", orderID)
		}
		if err := pubsub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
	}
	publish("u1", "fails")
	publish("u2", "permanent")
	publish("u3", "")
	publish("u4", "flaky")
	for i := range 5 {
		publish(fmt.Sprintf("ok-%d", i), fmt.Sprintf("ok-%d", i))
	}
	reasons := map[string]string{}
	for len(reasons) < 3 {
		select {
		case m := <-poisoned:
			reasons[m.UUID] = m.Metadata.Get(middleware.ReasonForPoisonedKey)
			m.Ack()
		case <-time.After(20 * time.Second):
			t.Fatalf("poison queue got %v, want 3 messages", reasons)
		}
	}
	for uuid, want := range map[string]string{"u1": "cannot decode", "u2": "unknown product", "u3": "no usable key"} {
		if !contains(reasons[uuid], want) {
			t.Errorf("poison %s: reason %q, want it to mention %q", uuid, reasons[uuid], want)
		}
	}
	dbtest.WaitFor(t, 20*time.Second, "six effects", func() bool { return e.effects(t) == 6 })
	for key, attempts := range map[string]int{"fails": 3, "permanent": 1, dedupewatermill.RefusedKeyPrefix + "u3": 0} {
		if n := e.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = $1 AND state = 'failed' AND attempts >= $2", key, attempts); n != 1 {
			t.Errorf("key %s not recorded failed", key)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// Messages a handler returns go to the outbox in its transaction: none for
// a failed try, one per committed message; a relay publishes them through
// RelayPublisher to Watermill, and a second router consumes them with their
// outbox id as UUID, each effect once even when the relay sends again.
func TestProducedMessagesThroughOutbox(t *testing.T) {
	e := setup(t, nil)
	ob, err := outbox.New(e.db.Pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dedupe.Migrate(context.Background(), e.db.Pool, ob.Config().Migration()); err != nil {
		t.Fatal(err)
	}
	pubsub := goChannel(t)
	var tries atomic.Int64
	mw := newMiddleware(t, e, dedupewatermill.Config{Outbox: ob})
	router(t, mw, pubsub, "orders", func(msg *message.Message) ([]*message.Message, error) {
		if err := insertEffect(msg); err != nil {
			return nil, err
		}
		out := message.NewMessage("shipment-"+msg.UUID, []byte("ship "+msg.UUID))
		out.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		if msg.UUID == "o1" && tries.Add(1) == 1 {
			return []*message.Message{out}, errors.New("fails after producing")
		}
		return []*message.Message{out}, nil
	}, pubsub, "shipments")
	shipped := newMiddleware(t, e, dedupewatermill.Config{Scope: "billing"})
	var mu sync.Mutex
	traces := map[string]string{}
	router(t, shipped, pubsub, "shipments", noPublish(func(msg *message.Message) error {
		mu.Lock()
		traces[msg.UUID] = msg.Metadata.Get("traceparent")
		mu.Unlock()
		return insertEffect(msg)
	}), nil, "")
	for _, id := range []string{"o1", "o2", "o3"} {
		if err := pubsub.Publish("orders", message.NewMessage(id, []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	dbtest.WaitFor(t, 20*time.Second, "three orders", func() bool { return e.effects(t) == 3 })
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_outbox"); n != 3 {
		t.Fatalf("outbox holds %d messages, want 3 (none of the failed try)", n)
	}
	rp, err := dedupewatermill.NewRelayPublisher(pubsub, dedupewatermill.RelayPublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, rp, outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Cycle(context.Background()); err != nil || n != 3 {
		t.Fatalf("relay cycle = %d, %v; want 3", n, err)
	}
	// A relay's re-send of one.
	if errs := rp.Publish(context.Background(), []*outbox.StoredMessage{{Message: outbox.Message{ID: "shipment-o2", Topic: "shipments"}}}); errs != nil {
		t.Fatal(errs)
	}
	dbtest.WaitFor(t, 20*time.Second, "three shipments", func() bool { return e.effects(t) == 6 })
	time.Sleep(100 * time.Millisecond)
	if n := e.db.Count(t, "SELECT count(*) FROM effects WHERE msg_id LIKE 'shipment-%'"); n != 3 {
		t.Fatalf("shipment effects = %d, want 3", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if traces["shipment-o1"] == "" {
		t.Fatalf("trace context lost on the way: %v", traces)
	}
}
