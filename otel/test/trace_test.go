package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
	"github.com/exactlyonce/dedupe/otel/internal/oteltest"
	"github.com/exactlyonce/dedupe/outbox"
)

// orders is how many orders each end-to-end test enqueues, each in its own
// traced request.
const orders = 4

// orderHdr carries the order's id: the consumer's dedup key, which a
// re-sent copy keeps.
const orderHdr = "Order-Id"

// effectFunc writes a consumed order's effect in the handler's transaction.
type effectFunc func(ctx context.Context, tx pgx.Tx, orderID string) error

// transport is a broker with the dedupe adapter in front of it.
type transport struct {
	system      string // messaging.system
	destination string // the subject or topic the outbox publishes to
	group       string // the consumer group or durable
	publisher   outbox.Publisher
	// start runs the adapter's runner in the background until the test
	// ends, calling effect for every message it claims; it returns a
	// function that stops the runner.
	start func(t *testing.T, inbox *dedupe.Inbox, effect effectFunc) (stop func())
	// resend publishes the consumed order orderID again with all its
	// headers (the trace context and the dedup key) under a new transport
	// id, as a producer that retries would.
	resend func(t *testing.T, orderID string)
}

// endToEnd enqueues orders inside traced requests, relays them through the
// transport, consumes them with its runner, re-sends one, and checks that
// each order's spans (request, create, send, process) share one trace id
// with the messaging attributes, that the re-sent copy gives a process span
// with dedupe.outcome=duplicate in the same trace, and that the metrics
// count what committed.
func endToEnd(t *testing.T, newTransport func(t *testing.T) *transport) {
	db := dbtest.New(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
	tr := newTransport(t)
	tel := oteltest.New(t, &dedupeotel.Config{OutboxSystem: tr.system})
	inbox, err := dedupe.New(db.Pool, dedupe.Config{Observer: tel.Obs, Logger: dbtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(db.Pool, outbox.Config{Observer: tel.Obs, Logger: dbtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}

	// The producer: each order enqueued in the transaction of a traced
	// request.
	traceOf := map[string]trace.TraceID{}
	for i := range orders {
		id := fmt.Sprintf("order-%d", i)
		rctx, req := tel.Tracer().Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		err := pgx.BeginFunc(rctx, db.Pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(rctx, tx, outbox.Message{Topic: tr.destination, Key: id,
				Headers: map[string][]string{orderHdr: {id}}, Payload: []byte(`{"id":"` + id + `"}`)})
			return err
		})
		req.End()
		if err != nil {
			t.Fatal(err)
		}
		traceOf[id] = req.SpanContext().TraceID()
	}

	// The relay publishes them through the adapter's outbox publisher.
	relay, err := outbox.NewRelay(ob, tr.publisher, outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	for published := 0; published < orders; {
		n, err := relay.Cycle(ctx)
		if err != nil {
			t.Fatalf("relay: %v", err)
		}
		if n == 0 {
			t.Fatalf("relay published %d of %d", published, orders)
		}
		published += n
	}

	// The consumer.
	stop := tr.start(t, inbox, func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (order_id) VALUES ($1)", id)
		return err
	})
	dbtest.WaitFor(t, 60*time.Second, "every order's effect", func() bool {
		return db.Count(t, "SELECT count(*) FROM effects") >= orders
	})
	tr.resend(t, "order-0")
	dbtest.WaitFor(t, 60*time.Second, "the re-sent copy handled as a duplicate", func() bool {
		return tel.Sum(t, "dedupe.claims", dedupeotel.OutcomeKey.String("duplicate")) >= 1
	})
	stop()

	if n, d := db.Count(t, "SELECT count(*) FROM effects"), db.Count(t, "SELECT count(DISTINCT order_id) FROM effects"); n != orders || d != orders {
		t.Fatalf("effects = %d (%d distinct), want %d", n, d, orders)
	}

	// The spans, by trace.
	byTrace := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	var process []sdktrace.ReadOnlySpan
	for _, s := range tel.Ended("") {
		byTrace[s.SpanContext().TraceID()] = append(byTrace[s.SpanContext().TraceID()], s)
		if oteltest.Attr(s, semconv.MessagingOperationTypeKey).AsString() == "process" {
			process = append(process, s)
		}
	}
	for id, tid := range traceOf {
		var create, send sdktrace.ReadOnlySpan
		var claimed, dups int
		for _, s := range byTrace[tid] {
			switch op := oteltest.Attr(s, semconv.MessagingOperationTypeKey).AsString(); op {
			case "create":
				create = s
			case "send":
				send = s
			}
		}
		if create == nil || send == nil {
			t.Fatalf("%s: trace %s holds %s: no create or send span", id, tid, names(byTrace[tid]))
		}
		for _, s := range byTrace[tid] {
			if oteltest.Attr(s, semconv.MessagingOperationTypeKey).AsString() != "process" {
				continue
			}
			if s.Parent().SpanID() != create.SpanContext().SpanID() {
				t.Errorf("%s: process span's parent is %s, not the create span", id, s.Parent().SpanID())
			}
			if !oteltest.Linked(s, create.SpanContext()) {
				t.Errorf("%s: process span does not link the create span", id)
			}
			oteltest.WantAttrs(t, s, semconv.MessagingSystemKey.String(tr.system),
				semconv.MessagingDestinationName(tr.destination), semconv.MessagingConsumerGroupName(tr.group),
				dedupeotel.ScopeKey.String(tr.group))
			if oteltest.Attr(s, semconv.MessagingMessageIDKey).AsString() == "" {
				t.Errorf("%s: process span without messaging.message.id", id)
			}
			switch oteltest.Attr(s, dedupeotel.OutcomeKey).AsString() {
			case "claimed":
				claimed++
			case "duplicate":
				dups++
			}
		}
		if claimed != 1 {
			t.Errorf("%s: %d claimed process spans in its trace (%s), want 1", id, claimed, names(byTrace[tid]))
		}
		if id == "order-0" && dups < 1 {
			t.Errorf("%s: the re-sent copy's duplicate span is not in its trace (%s)", id, names(byTrace[tid]))
		}
		if send.Parent().SpanID() != create.SpanContext().SpanID() {
			t.Errorf("%s: send span is not the create span's child", id)
		}
		oteltest.WantAttrs(t, send, semconv.MessagingSystemKey.String(tr.system), dedupeotel.OutcomeKey.String("published"))
	}
	if len(byTrace) != orders {
		t.Errorf("%d traces, want one per order (%d)", len(byTrace), orders)
	}

	// The metrics count what committed and what the spans show.
	spanOutcomes := map[string]int64{}
	for _, s := range process {
		spanOutcomes[oteltest.Attr(s, dedupeotel.OutcomeKey).AsString()]++
	}
	if n := tel.Sum(t, "dedupe.claims", dedupeotel.OutcomeKey.String("claimed")); n != orders || spanOutcomes["claimed"] != orders {
		t.Errorf("claimed: metric %d, spans %d; %d effects committed", n, spanOutcomes["claimed"], orders)
	}
	for o, n := range spanOutcomes {
		if m := tel.Sum(t, "dedupe.claims", dedupeotel.OutcomeKey.String(o), semconv.MessagingSystemKey.String(tr.system)); m != n {
			t.Errorf("dedupe.claims{outcome=%s} = %d, %d spans", o, m, n)
		}
	}
	if n := tel.Sum(t, "dedupe.outbox.enqueued"); n != orders {
		t.Errorf("enqueued = %d", n)
	}
	if n := tel.Sum(t, "dedupe.outbox.publishes", dedupeotel.OutcomeKey.String("published")); n != orders {
		t.Errorf("published = %d", n)
	}
	if n, _ := tel.Histogram(t, "dedupe.outbox.publish.lag"); n != orders {
		t.Errorf("publish lag points = %d", n)
	}
	// The adapter's transport events: nothing refused, given up on or left
	// unacknowledged; a Kafka runner committed the offsets when it stopped.
	for _, name := range []string{dedupe.EventRefused, dedupe.EventTerminated, dedupe.EventAckFailed} {
		if n := tel.Sum(t, "dedupe.transport.events", dedupeotel.EventKey.String(name)); n != 0 {
			t.Errorf("transport events %s = %d, want none", name, n)
		}
	}
	if tr.system == "kafka" {
		if n := tel.Sum(t, "dedupe.transport.events", dedupeotel.EventKey.String(dedupe.EventOffsetsCommitted),
			semconv.MessagingSystemKey.String("kafka")); n < 1 {
			t.Errorf("offsets committed = %d partitions, want at least 1", n)
		}
	}
}

func names(spans []sdktrace.ReadOnlySpan) string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return fmt.Sprint(out)
}
