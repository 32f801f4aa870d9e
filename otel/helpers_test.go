package dedupeotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// tel is an Observer over the SDK's in-memory span recorder and a manual
// metric reader.
type tel struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	obs    *dedupeotel.Observer
}

func newTel(t testing.TB, cfg *dedupeotel.Config) *tel {
	t.Helper()
	e := &tel{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		_ = e.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	var c dedupeotel.Config
	if cfg != nil {
		c = *cfg
	}
	c.TracerProvider, c.MeterProvider = e.tp, mp
	obs, err := dedupeotel.New(&c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.Close() })
	e.obs = obs
	return e
}

// tracer is the application's own tracer, on the same provider.
func (e *tel) tracer() trace.Tracer { return e.tp.Tracer("app") }

// ended returns the ended spans named name ("" for all).
func (e *tel) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if name == "" || s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// collect reads the metrics.
func (e *tel) collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
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

// sum adds up the points of the counter name whose attributes include attrs.
func (e *tel) sum(t testing.TB, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := find(e.collect(t), name)
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

// histogram returns the count and sum of the histogram name's points whose
// attributes include attrs.
func (e *tel) histogram(t testing.TB, name string, attrs ...attribute.KeyValue) (uint64, float64) {
	t.Helper()
	m, ok := find(e.collect(t), name)
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

// gauge returns the value of the gauge name's point whose attributes
// include attrs, and whether there is one.
func (e *tel) gauge(t testing.TB, name string, attrs ...attribute.KeyValue) (float64, bool) {
	t.Helper()
	m, ok := find(e.collect(t), name)
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

// attr returns the value of key on s, or an invalid value.
func attr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

// wantAttrs fails unless s carries each of want.
func wantAttrs(t testing.TB, s sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	for _, a := range want {
		if got := attr(s, a.Key); got != a.Value {
			t.Errorf("span %q: %s = %q, want %q", s.Name(), a.Key, got.Emit(), a.Value.Emit())
		}
	}
}

// linked reports whether s links to sc.
func linked(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}

// env is one test's database, with an inbox and an outbox reporting to tel.
type env struct {
	*tel
	db     *dbtest.DB
	inbox  *dedupe.Inbox
	outbox *dedupe.Outbox
}

func setup(t testing.TB, cfg *dedupe.Config) *env {
	t.Helper()
	e := &env{tel: newTel(t, &dedupeotel.Config{OutboxSystem: "test"}), db: dbtest.New(t)}
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, e.db.Pool, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	e.db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_key text NOT NULL)`)
	var c dedupe.Config
	if cfg != nil {
		c = *cfg
	}
	c.Observer = e.obs
	c.Logger = dbtest.Logger(t)
	var err error
	if e.inbox, err = dedupe.New(e.db.Pool, &c); err != nil {
		t.Fatal(err)
	}
	if e.outbox, err = dedupe.NewOutbox(e.db.Pool, &c); err != nil {
		t.Fatal(err)
	}
	return e
}

// delivery is a message as a transport hands it over.
type delivery struct {
	ID       string // the dedup key
	Delivery int
	Headers  map[string][]string
	Fail     bool // the handler fails on the first attempt
}

// describe is the ConsumerConfig.Describe of deliveries.
func describe(d delivery) dedupe.MessageInfo {
	var h dedupe.Headers
	if d.Headers != nil {
		h = dedupe.MapHeaders(d.Headers)
	}
	return dedupe.MessageInfo{System: "test", Destination: "orders.created", ID: fmt.Sprintf("%s/%d", d.ID, d.Delivery),
		Group: "billing", Partition: -1, Offset: -1, Delivery: d.Delivery, Headers: h}
}

// insertEffect writes the message's effect, and fails the first attempt of
// a message marked Fail.
func insertEffect(ctx context.Context, tx pgx.Tx, d delivery) error {
	if d.Fail && dedupe.ClaimFromContext(ctx).Attempt == 1 {
		return errors.New("first attempt fails")
	}
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", d.ID)
	return err
}

func (e *env) consumer(t testing.TB, h dedupe.HandlerFunc[delivery]) *dedupe.Consumer[delivery] {
	t.Helper()
	if h == nil {
		h = insertEffect
	}
	c, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[delivery]{
		Scope: "billing", Key: func(d delivery) (string, error) { return d.ID, nil }, Describe: describe,
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
