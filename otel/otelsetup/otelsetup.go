// Package otelsetup configures the OpenTelemetry SDK of a program from the
// standard environment variables, through the contrib autoexport module:
//
//   - OTEL_TRACES_EXPORTER: "console" (spans printed on standard output, one
//     short line per span as it ends; OTEL_EXPORTER_CONSOLE_FORMAT=json for
//     the SDK's JSON, a line of about a kilobyte per span),
//     "otlp" (to OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL
//     http/protobuf or grpc), or "none".
//   - OTEL_METRICS_EXPORTER: "console", "otlp", "prometheus" (a scrape
//     endpoint on OTEL_EXPORTER_PROMETHEUS_HOST:OTEL_EXPORTER_PROMETHEUS_PORT,
//     localhost:9464 by default) or "none".
//   - OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_SDK_DISABLED, and the
//     SDK's own (OTEL_METRIC_EXPORT_INTERVAL, OTEL_BSP_*).
//
// Unlike the specification's default (otlp), an unset variable means none:
// a program runs quietly without a collector until it is told where to send.
// The propagator is W3C Trace Context and Baggage.
//
// It is a module of its own so that the exporters (gRPC, protobuf, the
// Prometheus client) stay out of the graph of a program that imports only
// dedupe or dedupeotel.
package otelsetup

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config configures Start. The zero value is usable.
type Config struct {
	// ServiceName is the resource's service.name unless OTEL_SERVICE_NAME
	// or OTEL_RESOURCE_ATTRIBUTES set it. Defaults to the executable's
	// name.
	ServiceName string
	// Prometheus adds a metric reader whose Prometheus exposition
	// Telemetry.MetricsHandler serves, for the program's own HTTP server
	// (mount it at /metrics), whatever OTEL_METRICS_EXPORTER says.
	// Defaults to false.
	Prometheus bool
}

// Telemetry is what Start set up; the same providers are installed as the
// otel globals.
type Telemetry struct {
	// TracerProvider is the SDK's when a trace exporter is configured,
	// else the global one as it was (a no-op unless set elsewhere).
	TracerProvider trace.TracerProvider
	// MeterProvider is the SDK's when a metric reader is configured, else
	// the global one as it was.
	MeterProvider metric.MeterProvider
	// Propagator is W3C Trace Context and Baggage.
	Propagator propagation.TextMapPropagator
	// MetricsHandler serves the metrics in Prometheus's text format; nil
	// unless Config.Prometheus.
	MetricsHandler http.Handler

	shutdown []func(context.Context) error
}

// Start builds the tracer and meter providers the environment describes,
// installs them and the propagator as the otel globals, and returns them.
// Call Shutdown before the program exits: it flushes what is buffered.
func Start(ctx context.Context, cfg Config) (*Telemetry, error) {
	c := cfg
	if c.ServiceName == "" {
		c.ServiceName = strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	}
	t := &Telemetry{
		TracerProvider: otel.GetTracerProvider(),
		MeterProvider:  otel.GetMeterProvider(),
		Propagator:     propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
	otel.SetTextMapPropagator(t.Propagator)
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", c.ServiceName)), resource.Environment())
	if err != nil {
		return nil, err
	}
	disabled := strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true")

	if name := os.Getenv("OTEL_TRACES_EXPORTER"); name != "" && name != "none" && !disabled {
		var opt sdktrace.TracerProviderOption
		if strings.EqualFold(name, "console") && !strings.EqualFold(os.Getenv("OTEL_EXPORTER_CONSOLE_FORMAT"), "json") {
			// One short line per span, as each ends, instead of a line of JSON.
			opt = sdktrace.WithSyncer(&consoleExporter{w: os.Stdout})
		} else {
			exp, err := autoexport.NewSpanExporter(ctx)
			if err != nil {
				return nil, err
			}
			opt = sdktrace.WithBatcher(exp)
		}
		tp := sdktrace.NewTracerProvider(opt, sdktrace.WithResource(res))
		t.TracerProvider = tp
		t.shutdown = append(t.shutdown, tp.Shutdown)
		otel.SetTracerProvider(tp)
	}

	var readers []sdkmetric.Reader
	if name := os.Getenv("OTEL_METRICS_EXPORTER"); name != "" && name != "none" && !disabled {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, errors.Join(err, t.Shutdown(ctx))
		}
		readers = append(readers, r)
	}
	if c.Prometheus {
		reg := prometheus.NewRegistry()
		r, err := promexporter.New(promexporter.WithRegisterer(reg))
		if err != nil {
			return nil, errors.Join(err, t.Shutdown(ctx))
		}
		readers = append(readers, r)
		t.MetricsHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	}
	if len(readers) > 0 {
		opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
		for _, r := range readers {
			opts = append(opts, sdkmetric.WithReader(r))
		}
		mp := sdkmetric.NewMeterProvider(opts...)
		t.MeterProvider = mp
		t.shutdown = append(t.shutdown, mp.Shutdown)
		otel.SetMeterProvider(mp)
	}
	return t, nil
}

// Shutdown flushes and stops the providers Start built.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	t.shutdown = nil
	return errors.Join(errs...)
}
