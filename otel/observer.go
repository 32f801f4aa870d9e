package dedupeotel

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// ScopeName is the instrumentation scope of the spans and metrics.
const ScopeName = "github.com/exactlyonce/dedupe/otel"

// Config configures an Observer. The zero value is usable.
type Config struct {
	// TracerProvider makes the spans. Defaults to the global one
	// (otel.GetTracerProvider) as set when New is called.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Defaults to the global one
	// (otel.GetMeterProvider) as set when New is called.
	MeterProvider metric.MeterProvider
	// Propagator writes the trace context into outbox messages' headers and
	// reads it from handled messages' headers. Defaults to the global
	// propagator if one was set (otel.SetTextMapPropagator) when New is
	// called, else W3C Trace Context and Baggage: the context travels even
	// in a program that set no propagator.
	Propagator propagation.TextMapPropagator
	// OutboxSystem is the messaging.system of the outbox's create and send
	// spans ("nats", "kafka"): the outbox does not know which broker its
	// relay publishes to. Defaults to "" (the attribute is left out).
	OutboxSystem string
	// StatsTimeout bounds each Stats query ObserveStats makes at a metrics
	// collection. Defaults to 5s.
	StatsTimeout time.Duration
}

// Observer implements dedupe.Observer and outbox.Observer with OpenTelemetry
// spans and metrics.
// Set it as dedupe.Config.Observer (claims and handlings) and as
// outbox.Config.Observer (enqueue spans, the trace context stored with
// each outbox message, publishes; its relays report to it too unless
// outbox.RelayConfig.Observer is set). It is safe for concurrent use.
type Observer struct {
	cfg    Config
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	canon  map[string]string
	meter  metric.Meter
	sets   sync.Map // setKey → attribute.Set
	m      instruments

	// The outbox gauges read the relay's last OutboxQueued report unless
	// ObserveStats was given an outbox (then they read its Stats).
	queued        atomic.Pointer[outbox.Stats]
	outboxWatched atomic.Int32

	mu    sync.Mutex
	regs  []metric.Registration
	close bool
}

var (
	_ dedupe.Observer = (*Observer)(nil)
	_ outbox.Observer = (*Observer)(nil)
)

// New returns an Observer; the zero Config is the defaults.
//
// Its metrics (every attribute set is small and bounded: scopes, states,
// outcomes and event names, never ids):
//
//   - dedupe.claims (counter, {message}): handlings by outcome; attributes
//     dedupe.scope, dedupe.mode, dedupe.outcome, messaging.system.
//   - dedupe.handle.duration (histogram, s): a handling's duration, the
//     commit included; same attributes.
//   - dedupe.keys (gauge, {key}): keys by dedupe.scope and dedupe.state
//     (in_flight, complete, failed), read from Inbox.Stats (ObserveStats).
//   - dedupe.keys.oldest_in_flight.age (gauge, s): per dedupe.scope
//     (ObserveStats).
//   - dedupe.lease.renewals (counter): KeepAlive's renewals by dedupe.result.
//   - dedupe.lease.lost (counter): leases KeepAlive gave up on.
//   - dedupe.purge.deleted (counter, {key}) and dedupe.purges (counter, by
//     dedupe.result).
//   - dedupe.outbox.enqueued (counter, {message}).
//   - dedupe.outbox.publishes (counter, {message}): relay publishes by
//     dedupe.outcome (published, failed, parked).
//   - dedupe.outbox.publish.lag (histogram, s): from a message's enqueue to
//     the broker's confirmation, on the database's clock.
//   - dedupe.outbox.discarded (counter, {message}).
//   - dedupe.outbox.pending, dedupe.outbox.parked (gauges, {message}) and
//     dedupe.outbox.oldest_pending.age (gauge, s): from the relay's
//     OutboxQueued reports, or from Outbox.Stats when ObserveStats was given
//     the outbox (then with dedupe.outbox.table).
//   - dedupe.transport.events (counter): the adapters' transport events by
//     dedupe.event (the names of the dedupe.Event constants: ack_failed,
//     retried, released, refused, dead_lettered, dead_letter_failed,
//     terminated, batch_handled, batch_fallback, offsets_committed,
//     offset_commit_failed, partition_paused) and messaging.system; an
//     event's Count is added (the partitions of offsets_committed, the
//     messages of batch_handled).
func New(cfg Config) (*Observer, error) {
	c := cfg
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
		if len(c.Propagator.Fields()) == 0 { // the global no-op
			c.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
		}
	}
	if c.StatsTimeout < 0 {
		return nil, &dedupe.ConfigError{Field: "StatsTimeout", Reason: "must not be negative"}
	}
	if c.StatsTimeout == 0 {
		c.StatsTimeout = 5 * time.Second
	}
	o := &Observer{
		cfg:    c,
		tracer: c.TracerProvider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:   c.Propagator,
		canon:  canonical(c.Propagator.Fields()),
		meter:  c.MeterProvider.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)),
	}
	var err error
	if o.m, err = newInstruments(o.meter); err != nil {
		return nil, err
	}
	reg, err := o.meter.RegisterCallback(o.observeQueued, o.m.outboxPending, o.m.outboxParked, o.m.outboxOldest)
	if err != nil {
		return nil, err
	}
	o.regs = append(o.regs, reg)
	return o, nil
}

// Close unregisters the Observer's gauges (those of ObserveStats
// included). Spans and counters keep working.
func (o *Observer) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	var errs []error
	for _, r := range o.regs {
		errs = append(errs, r.Unregister())
	}
	o.regs, o.close = nil, true
	return errors.Join(errs...)
}
