package dedupeotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
	"github.com/exactlyonce/dedupe/otel/internal/oteltest"
	"github.com/exactlyonce/dedupe/outbox"
)

func (e *env) enqueue(t testing.TB, msgs ...outbox.Message) []string {
	t.Helper()
	var ids []string
	err := pgx.BeginFunc(context.Background(), e.db.Pool, func(tx pgx.Tx) error {
		for _, m := range msgs {
			id, err := e.outbox.Enqueue(context.Background(), tx, m)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestObserveStats: the gauges read Inbox.Stats and Outbox.Stats at each
// collection: keys by state (complete, failed, in flight), the oldest
// in-flight key's age, the pending outbox messages and the oldest's age.
func TestObserveStats(t *testing.T) {
	t.Parallel()
	e := setup(t, &dedupe.Config{MaxAttempts: 1})
	c := e.consumer(t, nil)
	ctx := context.Background()
	for _, d := range []delivery{{ID: "a"}, {ID: "b"}, {ID: "c", Fail: true}} {
		_, _ = c.Handle(ctx, d)
	}
	held, err := e.inbox.Begin(ctx, dedupe.Key{Scope: "billing", ID: "d"})
	if err != nil || held.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin: %v, %v", held, err)
	}
	e.enqueue(t, outbox.Message{Topic: "t", Key: "1"}, outbox.Message{Topic: "t", Key: "2"})

	if _, ok := e.Gauge(t, "dedupe.keys"); ok {
		t.Fatal("gauges observed before ObserveStats")
	}
	stop, err := e.Obs.ObserveStats(e.inbox, e.outbox)
	if err != nil {
		t.Fatal(err)
	}
	for state, want := range map[string]float64{"complete": 2, "failed": 1, "in_flight": 1} {
		got, ok := e.Gauge(t, "dedupe.keys", dedupeotel.ScopeKey.String("billing"), dedupeotel.StateKey.String(state))
		if !ok || got != want {
			t.Errorf("dedupe.keys{state=%s} = %v (%v), want %v", state, got, ok, want)
		}
	}
	if age, ok := e.Gauge(t, "dedupe.keys.oldest_in_flight.age", dedupeotel.ScopeKey.String("billing")); !ok || age < 0 || age > 60 {
		t.Errorf("oldest in flight age = %v (%v)", age, ok)
	}
	table := dedupeotel.OutboxTableKey.String(dedupe.DefaultOutboxTable)
	if n, ok := e.Gauge(t, "dedupe.outbox.pending", table); !ok || n != 2 {
		t.Errorf("outbox pending = %v (%v), want 2", n, ok)
	}
	if age, ok := e.Gauge(t, "dedupe.outbox.oldest_pending.age", table); !ok || age < 0 {
		t.Errorf("oldest pending age = %v (%v)", age, ok)
	}
	relay, err := outbox.NewRelay(e.outbox, outbox.PublishFunc(func(context.Context, *outbox.StoredMessage) error { return nil }),
		outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Cycle(ctx); err != nil || n != 2 {
		t.Fatalf("relay: %d, %v", n, err)
	}
	if n, ok := e.Gauge(t, "dedupe.outbox.pending", table); !ok || n != 0 {
		t.Errorf("outbox pending after the relay = %v (%v), want 0", n, ok)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Gauge(t, "dedupe.keys"); ok {
		t.Error("gauges still observed after stop")
	}
}

// TestRelayFeedsOutboxGauges: without ObserveStats, the outbox gauges show
// the relay's periodic OutboxQueued reports.
func TestRelayFeedsOutboxGauges(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.enqueue(t, outbox.Message{Topic: "t", Key: "1"})
	block := make(chan struct{})
	relay, err := outbox.NewRelay(e.outbox, outbox.PublishFunc(func(ctx context.Context, _ *outbox.StoredMessage) error {
		select { // hold the first publish until the gauge showed the message pending
		case <-block:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}), outbox.RelayConfig{DisableListen: true, StatsInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dbtest.Background(t, "relay", relay.Run)
	dbtest.WaitFor(t, 30*time.Second, "the pending message in the gauge", func() bool {
		n, ok := e.Gauge(t, "dedupe.outbox.pending")
		return ok && n == 1
	})
	close(block)
	dbtest.WaitFor(t, 30*time.Second, "an empty outbox in the gauge", func() bool {
		n, ok := e.Gauge(t, "dedupe.outbox.pending")
		return ok && n == 0
	})
}

// TestPublishFailures: a failed publish and a parked one give send spans
// with the error and are counted by outcome; a discard is counted.
func TestPublishFailures(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ids := e.enqueue(t, outbox.Message{Topic: "t", Key: "retry"}, outbox.Message{Topic: "t", Key: "park"})
	relay, err := outbox.NewRelay(e.outbox, outbox.PublishFunc(func(_ context.Context, m *outbox.StoredMessage) error {
		if m.Key == "park" {
			return dedupe.Permanent(errors.New("too large"))
		}
		return errors.New("broker said no")
	}), outbox.RelayConfig{DisableListen: true, HealthCheck: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = relay.Cycle(context.Background())
	if n := e.Sum(t, "dedupe.outbox.publishes", dedupeotel.OutcomeKey.String("failed")); n != 1 {
		t.Errorf("failed publishes = %d, want 1", n)
	}
	if n := e.Sum(t, "dedupe.outbox.publishes", dedupeotel.OutcomeKey.String("parked")); n != 1 {
		t.Errorf("parked publishes = %d, want 1", n)
	}
	if n, _ := e.Histogram(t, "dedupe.outbox.publish.lag"); n != 0 {
		t.Errorf("lag recorded for %d failed publishes", n)
	}
	spans := e.Ended("send t")
	if len(spans) != 2 {
		t.Fatalf("%d send spans", len(spans))
	}
	for _, s := range spans {
		if s.Status().Code != codes.Error {
			t.Errorf("send span status %v", s.Status())
		}
		o := attr(s, dedupeotel.OutcomeKey).AsString()
		wantAttrs(t, s, semconv.ErrorTypeKey.String(o))
	}
	if _, err := e.outbox.Discard(context.Background(), ids[1], "test", "parked on purpose"); err != nil {
		t.Fatal(err)
	}
	if n := e.Sum(t, "dedupe.outbox.discarded"); n != 1 {
		t.Errorf("discarded = %d", n)
	}
}

// TestTransportEvent: events are counted by name and system, Count
// included.
func TestTransportEvent(t *testing.T) {
	t.Parallel()
	e := oteltest.New(t, nil)
	ctx, span := e.Tracer().Start(context.Background(), "process")
	e.Obs.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventAckFailed, Message: dedupe.MessageInfo{System: "nats"}, Err: errors.New("timeout")})
	e.Obs.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventOffsetsCommitted, Message: dedupe.MessageInfo{System: "kafka"}, Count: 3})
	span.End()
	if n := e.Sum(t, "dedupe.transport.events", dedupeotel.EventKey.String(dedupe.EventAckFailed), semconv.MessagingSystemKey.String("nats")); n != 1 {
		t.Errorf("ack_failed = %d", n)
	}
	if n := e.Sum(t, "dedupe.transport.events", dedupeotel.EventKey.String(dedupe.EventOffsetsCommitted)); n != 3 {
		t.Errorf("offsets_committed = %d, want 3", n)
	}
	if ev := e.Ended("process")[0].Events(); len(ev) != 2 || ev[0].Name != "dedupe.transport."+dedupe.EventAckFailed {
		t.Errorf("span events %v", ev)
	}
}
