// Package oteltest records what a dedupeotel.Observer reports, with the
// SDK's in-memory span recorder and a manual metric reader, for tests.
package oteltest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	dedupeotel "github.com/exactlyonce/dedupe/otel"
)

// Tel is an Observer over the SDK's in-memory span recorder and a manual
// metric reader.
type Tel struct {
	Spans    *tracetest.SpanRecorder
	Provider *sdktrace.TracerProvider
	Reader   *sdkmetric.ManualReader
	Obs      *dedupeotel.Observer
}

// New returns a Tel whose Observer has cfg (nil for the defaults) with the
// recorder's providers; both are shut down when the test ends.
func New(t testing.TB, cfg *dedupeotel.Config) *Tel {
	t.Helper()
	e := &Tel{Spans: tracetest.NewSpanRecorder(), Reader: sdkmetric.NewManualReader()}
	e.Provider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.Spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.Reader))
	t.Cleanup(func() {
		_ = e.Provider.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	var c dedupeotel.Config
	if cfg != nil {
		c = *cfg
	}
	c.TracerProvider, c.MeterProvider = e.Provider, mp
	obs, err := dedupeotel.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.Close() })
	e.Obs = obs
	return e
}

// Tracer is the application's own tracer, on the same provider.
func (e *Tel) Tracer() trace.Tracer { return e.Provider.Tracer("app") }

// Ended returns the ended spans named name ("" for all).
func (e *Tel) Ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.Spans.Ended() {
		if name == "" || s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Collect reads the metrics.
func (e *Tel) Collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	return rm
}

// find returns the metric named name, if it was reported.
func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// has reports whether set holds every one of attrs.
func has(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, a := range attrs {
		if v, ok := set.Value(a.Key); !ok || v != a.Value {
			return false
		}
	}
	return true
}

// Sum adds up the points of the counter name whose attributes include attrs.
func (e *Tel) Sum(t testing.TB, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := find(e.Collect(t), name)
	if !ok {
		return 0
	}
	data, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is a %T, not an int64 sum", name, m.Data)
	}
	var n int64
	for _, p := range data.DataPoints {
		if has(p.Attributes, attrs) {
			n += p.Value
		}
	}
	return n
}

// Histogram returns the count and sum of the histogram name's points whose
// attributes include attrs.
func (e *Tel) Histogram(t testing.TB, name string, attrs ...attribute.KeyValue) (uint64, float64) {
	t.Helper()
	m, ok := find(e.Collect(t), name)
	if !ok {
		return 0, 0
	}
	data, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is a %T, not a float64 histogram", name, m.Data)
	}
	var (
		n   uint64
		sum float64
	)
	for _, p := range data.DataPoints {
		if has(p.Attributes, attrs) {
			n += p.Count
			sum += p.Sum
		}
	}
	return n, sum
}

// Gauge returns the value of the gauge name's point whose attributes
// include attrs, and whether there is one.
func (e *Tel) Gauge(t testing.TB, name string, attrs ...attribute.KeyValue) (float64, bool) {
	t.Helper()
	m, ok := find(e.Collect(t), name)
	if !ok {
		return 0, false
	}
	switch data := m.Data.(type) {
	case metricdata.Gauge[int64]:
		for _, p := range data.DataPoints {
			if has(p.Attributes, attrs) {
				return float64(p.Value), true
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range data.DataPoints {
			if has(p.Attributes, attrs) {
				return p.Value, true
			}
		}
	default:
		t.Fatalf("%s is a %T, not a gauge", name, m.Data)
	}
	return 0, false
}

// Attr returns the value of key on s, or an invalid value.
func Attr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

// WantAttrs fails unless s carries each of want.
func WantAttrs(t testing.TB, s sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	for _, a := range want {
		if got := Attr(s, a.Key); got != a.Value {
			t.Errorf("span %q: %s = %q, want %q", s.Name(), a.Key, got.Emit(), a.Value.Emit())
		}
	}
}

// Linked reports whether s links to sc.
func Linked(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}
