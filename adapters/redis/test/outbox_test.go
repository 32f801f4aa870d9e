package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
	"github.com/exactlyonce/dedupe/internal/outboxtest"
	"github.com/exactlyonce/dedupe/internal/redistest"
	"github.com/exactlyonce/dedupe/outbox"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// Messages committed through the outbox reach the stream with their id,
// payload, order key and trace context as fields; a relay's re-send (it
// died after the XADD, before recording it) adds a second entry that the
// consuming runner absorbs: each effect once, and the runner's Observer
// reads the trace context back from the entry.
func TestOutboxPublisherToRunner(t *testing.T) {
	db, ob := outboxtest.New(t)
	b := setup(t, db)
	pub, err := deduperedis.NewOutboxPublisher(b.rdb, deduperedis.OutboxPublisherConfig{
		Stream: func(topic string) string { return b.stream },
	})
	if err != nil {
		t.Fatal(err)
	}
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
	entries, err := b.rdb.XRange(ctx, b.stream, "-", "+").Result()
	if err != nil || len(entries) != 3 {
		t.Fatalf("stream: %v, %v; want 3 entries", entries, err)
	}
	var first map[string]any
	for _, e := range entries {
		if e.Values["id"] == ids[0] {
			first = e.Values
		}
	}
	if first["id"] != ids[0] || first["payload"] != "a" || first["key"] != "o1" || first["traceparent"] != traceparent {
		t.Fatalf("first entry = %v", first)
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
	b = b.observed(t, dedupe.Observers(obs, observetest.OnHandled(func(h dedupe.HandleInfo, _ dedupe.HandleDone) {
		if h.Message.Headers != nil && h.Message.Headers.Get("traceparent") != "" {
			mu.Lock()
			traces[h.Key.ID] = h.Message.Headers.Get("traceparent")
			mu.Unlock()
		}
	})))
	run(t, newRunner(t, b, nil, fastConfig(t), nil))
	obs.Wait(t, 20*time.Second, "five entries handled", func() bool {
		return obs.Handled(dedupe.OutcomeClaimed)+obs.Handled(dedupe.OutcomeDuplicate) >= 5
	})
	dbtest.WaitFor(t, 10*time.Second, "every entry acknowledged", func() bool { return b.pending(t) == 0 })
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

// A key holding another type is a permanent failure (parked), a header
// named like the entry's own fields too, and an unreachable Redis fails the
// health check.
func TestOutboxPublisherFailures(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	notStream := redistest.Stream(t, rdb, "string")
	if err := rdb.Set(ctx, notStream, "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	good := redistest.Stream(t, rdb, "good")
	pub, err := deduperedis.NewOutboxPublisher(rdb, deduperedis.OutboxPublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	errs := pub.Publish(ctx, []*outbox.StoredMessage{
		{Message: outbox.Message{ID: "1", Topic: notStream}},
		{Message: outbox.Message{ID: "2", Topic: good, Headers: map[string][]string{"payload": {"x"}}}},
		{Message: outbox.Message{ID: "3", Topic: good}},
	})
	if len(errs) != 3 || !dedupe.IsPermanent(errs[0]) || !dedupe.IsPermanent(errs[1]) || errs[2] != nil {
		t.Fatalf("errors = %v; want two permanent and nil", errs)
	}
	if n, _ := rdb.XLen(ctx, good).Result(); n != 1 {
		t.Fatalf("good stream holds %d entries, want 1", n)
	}
	if err := pub.CheckHealth(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	dpub, _ := deduperedis.NewOutboxPublisher(down, deduperedis.OutboxPublisherConfig{})
	if err := dpub.CheckHealth(ctx); err == nil {
		t.Fatal("health of an unreachable Redis: nil error")
	}
	if errs := dpub.Publish(ctx, []*outbox.StoredMessage{{Message: outbox.Message{ID: "4", Topic: good}}}); len(errs) != 1 || errs[0] == nil || dedupe.IsPermanent(errs[0]) {
		t.Fatalf("publish to an unreachable Redis = %v; want one transient error", errs)
	}
}
