package otelkit

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"

	dedupeotel "github.com/exactlyonce/dedupe/otel"
	"github.com/exactlyonce/dedupe/otel/otelsetup"
)

// Options configure Start.
type Options struct {
	// Service is the service.name, unless OTEL_SERVICE_NAME sets it.
	Service string
	// OutboxSystem is the broker the outbox publishes to ("nats",
	// "kafka"), for its spans. Defaults to none.
	OutboxSystem string
	// Prometheus serves the metrics through Handler's GET /metrics.
	Prometheus bool
}

// Telemetry is a program's OpenTelemetry and its dedupe Observer.
type Telemetry struct {
	*otelsetup.Telemetry
	// Observer reports what dedupe does to the program's providers: set it
	// as dedupe.Config.Observer.
	Observer *dedupeotel.Observer
	service  string
}

// Start configures OpenTelemetry from the environment and builds the
// Observer on its providers. Call Shutdown before exiting.
func Start(ctx context.Context, o Options) (*Telemetry, error) {
	tel, err := otelsetup.Start(ctx, otelsetup.Config{ServiceName: o.Service, Prometheus: o.Prometheus})
	if err != nil {
		return nil, err
	}
	obs, err := dedupeotel.New(dedupeotel.Config{TracerProvider: tel.TracerProvider, MeterProvider: tel.MeterProvider,
		Propagator: tel.Propagator, OutboxSystem: o.OutboxSystem})
	if err != nil {
		return nil, errors.Join(err, tel.Shutdown(ctx))
	}
	return &Telemetry{Telemetry: tel, Observer: obs, service: o.Service}, nil
}

// Handler serves routes traced by otelhttp, and the metrics at GET
// /metrics when Options.Prometheus is set. The routes are public endpoints:
// each request's server span starts a trace of its own and links the
// caller's traceparent (otelhttp.WithPublicEndpointFn), and the caller's
// baggage is not extracted (only the W3C trace context is), as dedupe's own
// public endpoints do (dedupe.MessageInfo.Untrusted).
func (t *Telemetry) Handler(routes http.Handler) http.Handler {
	mux := http.NewServeMux()
	if t.MetricsHandler != nil {
		mux.Handle("GET /metrics", t.MetricsHandler)
	}
	mux.Handle("/", otelhttp.NewHandler(routes, t.service,
		otelhttp.WithTracerProvider(t.TracerProvider), otelhttp.WithMeterProvider(t.MeterProvider),
		otelhttp.WithPropagators(propagation.TraceContext{}), otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true })))
	return mux
}

// Shutdown stops the Observer's gauges and flushes the exporters.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	return errors.Join(t.Observer.Close(), t.Telemetry.Shutdown(ctx))
}
