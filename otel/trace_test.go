package dedupeotel_test

import (
	"context"
	"maps"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
	"github.com/exactlyonce/dedupe/outbox"
)

// consumed is what a broker hands a consumer: the published message with
// its headers.
type consumed struct {
	ID      string
	Topic   string
	Headers map[string][]string
}

// broker is an in-memory transport: its Publish copies each message's
// headers into a consumed message.
type broker struct {
	mu   sync.Mutex
	msgs []consumed
}

func (b *broker) Publish(_ context.Context, m *outbox.StoredMessage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.msgs = append(b.msgs, consumed{ID: m.ID, Topic: m.Topic, Headers: maps.Clone(m.Headers)})
	return nil
}

// TestOneTraceEnqueueSendProcess: a message enqueued inside a traced
// request, published by the relay and handled twice (the second a
// duplicate) gives one trace: request → create → send, and create →
// process (claimed) and process (duplicate), with the messaging attributes,
// and the metrics count one enqueue, one publish with its lag, one claim and
// one duplicate.
func TestOneTraceEnqueueSendProcess(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()

	// The producer: a traced request that enqueues in its transaction.
	rctx, req := e.Tracer().Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	var id string
	err := pgx.BeginFunc(rctx, e.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = e.outbox.Enqueue(rctx, tx, outbox.Message{Topic: "orders.created", Key: "o-1",
			Headers: map[string][]string{"Order-Id": {"o-1"}}, Payload: []byte(`{}`)})
		return err
	})
	req.End()
	if err != nil {
		t.Fatal(err)
	}

	// The relay publishes it.
	b := &broker{}
	relay, err := outbox.NewRelay(e.outbox, outbox.PublishFunc(b.Publish), outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Cycle(ctx); err != nil || n != 1 {
		t.Fatalf("relay: published %d, %v", n, err)
	}
	if len(b.msgs) != 1 || b.msgs[0].ID != id {
		t.Fatalf("broker holds %+v", b.msgs)
	}
	msg := b.msgs[0]
	if msg.Headers["traceparent"] == nil || msg.Headers["Order-Id"][0] != "o-1" {
		t.Fatalf("published headers %v: want the W3C trace context beside the message's own", msg.Headers)
	}

	// The consumer, in another process: its context knows nothing of the
	// trace; the message's headers carry it.
	c, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[consumed]{
		Scope: "billing", Key: func(m consumed) (string, error) { return m.ID, nil },
		Describe: func(m consumed) dedupe.MessageInfo {
			return dedupe.MessageInfo{System: "test", Destination: m.Topic, ID: m.ID, Group: "billing",
				Partition: -1, Offset: -1, Delivery: 1, Headers: dedupe.MapHeaders(m.Headers)}
		},
	}, func(ctx context.Context, tx pgx.Tx, m consumed) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", m.ID)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for want, o := range []dedupe.Outcome{dedupe.OutcomeClaimed, dedupe.OutcomeDuplicate} {
		if got, err := c.Handle(ctx, msg); err != nil || got != o {
			t.Fatalf("handle %d: %v, %v; want %v", want, got, err, o)
		}
	}

	one := func(name string) sdktrace.ReadOnlySpan {
		t.Helper()
		s := e.Ended(name)
		if len(s) != 1 {
			t.Fatalf("%d spans %q, want 1", len(s), name)
		}
		return s[0]
	}
	request, create, send := one("POST /orders"), one("create orders.created"), one("send orders.created")
	process := e.Ended("process orders.created")
	if len(process) != 2 {
		t.Fatalf("%d process spans, want 2", len(process))
	}
	traceID := request.SpanContext().TraceID()
	for _, s := range e.Ended("") {
		if s.SpanContext().TraceID() != traceID {
			t.Errorf("span %q in trace %s, want %s", s.Name(), s.SpanContext().TraceID(), traceID)
		}
	}
	if create.Parent().SpanID() != request.SpanContext().SpanID() {
		t.Errorf("create's parent is not the request")
	}
	if send.Parent().SpanID() != create.SpanContext().SpanID() || !linked(send, create.SpanContext()) {
		t.Errorf("send is not a child of create, linked to it")
	}
	wantAttrs(t, create, semconv.MessagingOperationTypeCreate, semconv.MessagingDestinationName("orders.created"),
		semconv.MessagingMessageID(id), semconv.MessagingSystemKey.String("test"))
	wantAttrs(t, send, semconv.MessagingOperationTypeSend, semconv.MessagingDestinationName("orders.created"),
		semconv.MessagingMessageID(id), semconv.MessagingSystemKey.String("test"),
		dedupeotel.OutcomeKey.String("published"), dedupeotel.AttemptKey.Int(1))
	if create.SpanKind() != trace.SpanKindProducer || send.SpanKind() != trace.SpanKindProducer {
		t.Errorf("create and send kinds: %v, %v", create.SpanKind(), send.SpanKind())
	}
	outcomes := map[string]bool{}
	for _, p := range process {
		if p.Parent().SpanID() != create.SpanContext().SpanID() || !linked(p, create.SpanContext()) {
			t.Errorf("process is not a child of create, linked to it")
		}
		wantAttrs(t, p, semconv.MessagingSystemKey.String("test"), semconv.MessagingDestinationName("orders.created"),
			semconv.MessagingMessageID(id), semconv.MessagingConsumerGroupName("billing"),
			semconv.MessagingOperationTypeProcess, dedupeotel.ScopeKey.String("billing"))
		outcomes[attr(p, dedupeotel.OutcomeKey).AsString()] = true
	}
	if !outcomes["claimed"] || !outcomes["duplicate"] {
		t.Errorf("process outcomes %v, want claimed and duplicate", outcomes)
	}

	if n := e.Sum(t, "dedupe.outbox.enqueued"); n != 1 {
		t.Errorf("enqueued = %d", n)
	}
	if n := e.Sum(t, "dedupe.outbox.publishes", dedupeotel.OutcomeKey.String("published")); n != 1 {
		t.Errorf("published = %d", n)
	}
	if n, lag := e.Histogram(t, "dedupe.outbox.publish.lag"); n != 1 || lag < 0 {
		t.Errorf("publish lag: %d points, sum %v", n, lag)
	}
	for _, o := range []string{"claimed", "duplicate"} {
		if n := e.Sum(t, "dedupe.claims", dedupeotel.OutcomeKey.String(o)); n != 1 {
			t.Errorf("claims{%s} = %d, want 1", o, n)
		}
	}
}

// TestLocalSpanStaysParent: a handling under a live local span (an HTTP
// server span) stays its child and links the message's creation context.
// The creation context is found in an http.Header whose keys net/http
// canonicalised ("Traceparent").
func TestLocalSpanStaysParent(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	pctx, producer := e.Tracer().Start(ctx, "producer")
	producer.End()
	h := http.Header{}
	propagation.TraceContext{}.Inject(pctx, propagation.HeaderCarrier(h))
	if h.Get("Traceparent") == "" || h["traceparent"] != nil {
		t.Fatalf("headers %v: want the canonical key only", h)
	}

	c, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[http.Header]{
		Scope: "hooks", Key: func(http.Header) (string, error) { return "evt-1", nil },
		Describe: func(h http.Header) dedupe.MessageInfo {
			return dedupe.MessageInfo{System: "webhook", Destination: "/hooks", Partition: -1, Headers: dedupe.MapHeaders(h)}
		},
	}, func(context.Context, pgx.Tx, http.Header) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	sctx, server := e.Tracer().Start(ctx, "POST /hooks", trace.WithSpanKind(trace.SpanKindServer))
	if _, err := c.Handle(sctx, h); err != nil {
		t.Fatal(err)
	}
	server.End()

	// Without a local span the creation context is the parent.
	if _, err := c.Handle(ctx, h); err != nil {
		t.Fatal(err)
	}
	p := e.Ended("process /hooks")
	if len(p) != 2 {
		t.Fatalf("%d process spans", len(p))
	}
	if p[0].Parent().SpanID() != server.SpanContext().SpanID() || !linked(p[0], producer.SpanContext()) {
		t.Errorf("under a server span: parent %v, links %v", p[0].Parent(), p[0].Links())
	}
	if p[1].Parent().SpanID() != producer.SpanContext().SpanID() || !linked(p[1], producer.SpanContext()) {
		t.Errorf("without a local span: parent %v, links %v", p[1].Parent(), p[1].Links())
	}
	wantAttrs(t, p[1], dedupeotel.OutcomeKey.String("duplicate"), semconv.MessagingSystemKey.String("webhook"),
		semconv.MessagingMessageID("evt-1"))
}
