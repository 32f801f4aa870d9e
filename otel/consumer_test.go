package dedupeotel_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
)

// TestConsumerMetricsEqualEffects fires every message three times at once
// (some failing their first attempt) and then once more, and checks that
// the metrics count exactly what Handle reported and what committed: one
// claimed handling per effect row, a duplicate span for every absorbed
// delivery, a span per handling with the messaging attributes, and the
// handler's own span a child of its process span.
func TestConsumerMetricsEqualEffects(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	c := e.consumer(t, func(ctx context.Context, tx pgx.Tx, d delivery) error {
		_, span := e.Tracer().Start(ctx, "effect")
		defer span.End()
		return insertEffect(ctx, tx, d)
	})
	ctx := context.Background()
	const keys, copies = 24, 3
	var (
		mu     sync.Mutex
		tally  = map[dedupe.Outcome]int64{}
		errors int64
	)
	handle := func(d delivery) {
		o, err := c.Handle(ctx, d)
		mu.Lock()
		defer mu.Unlock()
		tally[o]++
		if err != nil && o != dedupe.OutcomeRetry {
			errors++
			t.Errorf("%s: %v (%v)", d.ID, o, err)
		}
	}
	for k := range keys {
		id := fmt.Sprintf("order-%02d", k)
		dbtest.Together(copies, func(i int) { handle(delivery{ID: id, Delivery: i + 1, Fail: k%4 == 0}) })
	}
	for k := range keys { // the redelivery after a failed attempt, or one more duplicate
		handle(delivery{ID: fmt.Sprintf("order-%02d", k), Delivery: copies + 1, Fail: k%4 == 0})
	}
	if errors > 0 {
		t.FailNow()
	}

	effects := int64(e.db.Count(t, "SELECT count(*) FROM effects"))
	if effects != keys || tally[dedupe.OutcomeClaimed] != keys {
		t.Fatalf("effects = %d, claimed = %d; want %d each", effects, tally[dedupe.OutcomeClaimed], keys)
	}
	if tally[dedupe.OutcomeRetry] == 0 || tally[dedupe.OutcomeDuplicate] == 0 {
		t.Fatalf("outcomes %v: want retries and duplicates", tally)
	}
	var total int64
	for o, n := range tally {
		total += n
		got := e.Sum(t, "dedupe.claims", dedupeotel.ScopeKey.String("billing"), dedupeotel.OutcomeKey.String(o.String()),
			dedupeotel.ModeKey.String("transactional"), semconv.MessagingSystemKey.String("test"))
		if got != n {
			t.Errorf("dedupe.claims{outcome=%s} = %d, Handle reported %d", o, got, n)
		}
	}
	if n, _ := e.Histogram(t, "dedupe.handle.duration", dedupeotel.ScopeKey.String("billing")); n != uint64(total) {
		t.Errorf("dedupe.handle.duration count = %d, want %d", n, total)
	}

	spans := e.Ended("process orders.created")
	if int64(len(spans)) != total {
		t.Fatalf("%d process spans for %d handlings", len(spans), total)
	}
	byOutcome := map[string]int64{}
	byID := map[trace.SpanID]bool{}
	for _, s := range spans {
		byOutcome[attr(s, dedupeotel.OutcomeKey).AsString()]++
		byID[s.SpanContext().SpanID()] = true
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span kind %v", s.SpanKind())
		}
		wantAttrs(t, s, semconv.MessagingSystemKey.String("test"), semconv.MessagingDestinationName("orders.created"),
			semconv.MessagingConsumerGroupName("billing"), semconv.MessagingOperationTypeProcess,
			dedupeotel.ScopeKey.String("billing"), dedupeotel.ModeKey.String("transactional"))
		if id := attr(s, semconv.MessagingMessageIDKey).AsString(); id == "" {
			t.Errorf("no message id on %v", s.Attributes())
		}
		if d := attr(s, dedupeotel.DeliveryKey).AsInt64(); d < 1 || d > copies+1 {
			t.Errorf("dedupe.delivery = %d", d)
		}
		switch attr(s, dedupeotel.OutcomeKey).AsString() {
		case "claimed", "retry":
			if a := attr(s, dedupeotel.AttemptKey).AsInt64(); a < 1 {
				t.Errorf("claimed span without attempt: %v", s.Attributes())
			}
		}
	}
	for o, n := range tally {
		if byOutcome[o.String()] != n {
			t.Errorf("%d spans with dedupe.outcome=%s, Handle reported %d", byOutcome[o.String()], o, n)
		}
	}
	effectSpans := e.Ended("effect")
	if len(effectSpans) == 0 {
		t.Fatal("the handler's spans were not recorded")
	}
	for _, s := range effectSpans {
		if !byID[s.Parent().SpanID()] {
			t.Fatalf("the handler's span is not a child of a process span")
		}
	}
}
