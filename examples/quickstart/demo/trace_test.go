package demo

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
)

// TestQuickstartTraces runs the quickstart with the OpenTelemetry Observer
// on an in-memory recorder: every placed copy of an order is one trace from
// "place order" through create and send to its processing, and the claims
// the metrics count equal the effects written and the duplicates the runner
// absorbed.
func TestQuickstartTraces(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	obs, err := dedupeotel.New(dedupeotel.Config{TracerProvider: tp, MeterProvider: mp, OutboxSystem: "nats"})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()

	rep, err := Run(context.Background(), Options{
		Orders: 30, DupRate: 0.5, FailRate: 0.2, Consumers: 2, Workers: 2,
		DatabaseURL: dbtest.BaseURL(t), DatabaseSource: "test", Timeout: 30 * time.Second,
		Observer: obs, Place: tracePlacement(tp),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("effects = %d (distinct %d), want %d", rep.Effects, rep.DistinctEffects, rep.Unique)
	}

	byTrace := map[trace.TraceID]map[string]int{}
	outcomes := map[string]int64{}
	for _, s := range spans.Ended() {
		id := s.SpanContext().TraceID()
		if byTrace[id] == nil {
			byTrace[id] = map[string]int{}
		}
		byTrace[id][s.Name()]++
		for _, a := range s.Attributes() {
			if a.Key == dedupeotel.OutcomeKey && s.SpanKind() == trace.SpanKindConsumer {
				outcomes[a.Value.AsString()]++
			}
		}
	}
	if int64(len(byTrace)) != rep.Published {
		t.Errorf("%d traces for %d placed copies", len(byTrace), rep.Published)
	}
	for id, names := range byTrace {
		if names["place order"] != 1 || names["create orders.created"] != 1 || names["send orders.created"] < 1 ||
			names["process orders.created"] < 1 {
			t.Errorf("trace %s holds %v: want place order, create, send and process", id, names)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	claims := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "dedupe.claims" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				o, _ := p.Attributes.Value(dedupeotel.OutcomeKey)
				claims[o.AsString()] += p.Value
			}
		}
	}
	if claims["claimed"] != rep.Effects || outcomes["claimed"] != rep.Effects {
		t.Errorf("claimed: metric %d, spans %d; effects written %d", claims["claimed"], outcomes["claimed"], rep.Effects)
	}
	if claims["duplicate"] != rep.Duplicates || outcomes["duplicate"] != rep.Duplicates {
		t.Errorf("duplicate: metric %d, spans %d; the runner absorbed %d", claims["duplicate"], outcomes["duplicate"], rep.Duplicates)
	}
	if claims["retry"] != rep.Retries {
		t.Errorf("retry: metric %d; the runner retried %d", claims["retry"], rep.Retries)
	}
}

// tracePlacement starts a "place order" span around each placement, as
// examples/telemetry does.
func tracePlacement(tp trace.TracerProvider) func(context.Context, string) (context.Context, func()) {
	tracer := tp.Tracer("github.com/exactlyonce/dedupe/examples/quickstart/demo")
	return func(ctx context.Context, id string) (context.Context, func()) {
		ctx, span := tracer.Start(ctx, "place order", trace.WithAttributes(attribute.String("order.id", id)))
		return ctx, func() { span.End() }
	}
}
