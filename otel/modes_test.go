package dedupeotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
)

// produced returns headers carrying the context of a new producer span, and
// that span's context.
func (e *env) produced(name string) (map[string][]string, trace.SpanContext) {
	ctx, span := e.Tracer().Start(context.Background(), name)
	span.End()
	h := map[string][]string{}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
	return h, span.SpanContext()
}

// TestBatchConsumer: each message of a batch gets its own process span, a
// child of its own creation context, with mode batch; a message seen in an
// earlier batch is a duplicate.
func TestBatchConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	bc, err := dedupe.NewBatchConsumer(e.inbox, dedupe.ConsumerConfig[delivery]{
		Scope: "billing", Key: func(d delivery) (string, error) { return d.ID, nil }, Describe: describe,
	}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	var parents []trace.SpanContext
	msg := func(id string) delivery {
		h, sc := e.produced("produce " + id)
		parents = append(parents, sc)
		return delivery{ID: id, Delivery: 1, Headers: h}
	}
	ctx := context.Background()
	for _, r := range bc.HandleBatch(ctx, []delivery{msg("a"), msg("b"), msg("c")}) {
		if r.Err != nil || r.Outcome != dedupe.OutcomeClaimed {
			t.Fatalf("first batch: %+v", r)
		}
	}
	res := bc.HandleBatch(ctx, []delivery{msg("a"), msg("d")}) // a again: a new copy, new trace
	if res[0].Outcome != dedupe.OutcomeDuplicate || res[1].Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("second batch: %+v", res)
	}
	spans := e.Ended("process orders.created")
	if len(spans) != 5 {
		t.Fatalf("%d process spans, want 5", len(spans))
	}
	dups := 0
	for _, s := range spans {
		wantAttrs(t, s, dedupeotel.ModeKey.String("batch"))
		if attr(s, dedupeotel.OutcomeKey).AsString() == "duplicate" {
			dups++
		}
	}
	if dups != 1 {
		t.Errorf("%d duplicate spans, want 1", dups)
	}
	// Each message's span is the child of its own producer (the second "a"
	// is a new copy with its own trace).
	seen := map[trace.TraceID]int{}
	for _, s := range spans {
		seen[s.SpanContext().TraceID()]++
		found := false
		for _, p := range parents {
			if s.Parent().SpanID() == p.SpanID() && s.SpanContext().TraceID() == p.TraceID() {
				found = true
			}
		}
		if !found {
			t.Errorf("span %v is not the child of a producer", s.SpanContext())
		}
	}
	if len(seen) != 5 {
		t.Errorf("process spans in %d traces, want 5", len(seen))
	}
	if n := e.Sum(t, "dedupe.claims", dedupeotel.ModeKey.String("batch"), dedupeotel.OutcomeKey.String("claimed")); n != 4 {
		t.Errorf("claimed = %d, want 4", n)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != 4 {
		t.Errorf("effects = %d", n)
	}
}

// TestLeased: Begin to Complete is one process span (mode leased) in the
// trace of the message info in the context; KeepAlive's renewals are
// counted; a second Begin is a duplicate; an operator's release makes
// KeepAlive lose the lease, counted; purged keys are counted.
func TestLeased(t *testing.T) {
	t.Parallel()
	e := setup(t, &dedupe.Config{Lease: 3 * time.Second})
	h, producer := e.produced("task scheduled")
	ctx := dedupe.WithMessageInfo(context.Background(), dedupe.MessageInfo{System: "airflow", Destination: "nightly",
		ID: "run-1", Partition: -1, Headers: dedupe.MapHeaders(h)})
	key := dedupe.Key{Scope: "tasks", ID: "run-1"}

	c, err := e.inbox.Begin(ctx, key)
	if err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin: %v, %v", c, err)
	}
	hb := e.inbox.KeepAlive(ctx, c, 20*time.Millisecond)
	dbtest.WaitFor(t, 30*time.Second, "two renewals", func() bool {
		return e.Sum(t, "dedupe.lease.renewals", dedupeotel.ResultKey.String("ok")) >= 2
	})
	if err := hb.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := e.inbox.Complete(ctx, c, dedupe.Result{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if d, err := e.inbox.Begin(ctx, key); err != nil || d.Outcome != dedupe.OutcomeDuplicate {
		t.Fatalf("second begin: %v, %v", d, err)
	}
	spans := e.Ended("process nightly")
	if len(spans) != 2 {
		t.Fatalf("%d process spans, want 2", len(spans))
	}
	for i, want := range []string{"claimed", "duplicate"} {
		s := spans[i]
		wantAttrs(t, s, dedupeotel.ModeKey.String("leased"), dedupeotel.OutcomeKey.String(want),
			dedupeotel.ScopeKey.String("tasks"), dedupeotel.AttemptKey.Int(1))
		if s.Parent().SpanID() != producer.SpanID() || s.SpanContext().TraceID() != producer.TraceID() {
			t.Errorf("span %d is not the producer's child", i)
		}
	}

	// An operator releases a held key: KeepAlive's next renewal is refused.
	lost := dedupe.Key{Scope: "tasks", ID: "run-2"}
	c2, err := e.inbox.Begin(context.Background(), lost)
	if err != nil || c2.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin: %v, %v", c2, err)
	}
	hb2 := e.inbox.KeepAlive(context.Background(), c2, 20*time.Millisecond)
	if err := e.inbox.Release(context.Background(), lost); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hb2.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("KeepAlive did not lose the released lease")
	}
	if err := hb2.Stop(); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("stop: %v", err)
	}
	if n := e.Sum(t, "dedupe.lease.lost"); n != 1 {
		t.Errorf("lease.lost = %d, want 1", n)
	}
	if n := e.Sum(t, "dedupe.lease.renewals", dedupeotel.ResultKey.String("error")); n != 1 {
		t.Errorf("failed renewals = %d, want 1", n)
	}

}

// TestPurge: the keys a purge deleted are counted.
func TestPurge(t *testing.T) {
	t.Parallel()
	e := setup(t, &dedupe.Config{Lease: 10 * time.Millisecond, Retention: 10 * time.Millisecond})
	c := e.consumer(t, nil)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := c.Handle(context.Background(), delivery{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // the retention runs out
	n, err := e.inbox.Purge(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Sum(t, "dedupe.purge.deleted"); got != n || n != 3 {
		t.Errorf("purge.deleted = %d, Purge reported %d, want 3", got, n)
	}
	if got := e.Sum(t, "dedupe.purges", dedupeotel.ResultKey.String("ok")); got != 1 {
		t.Errorf("purges = %d", got)
	}
}
