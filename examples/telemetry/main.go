// Command telemetry is the quickstart with OpenTelemetry turned on: each
// order is one trace from its placement to its processing, "place order" →
// "create orders.created" (the outbox enqueue) → "send orders.created" (the
// relay's publish) → "process orders.created" (each delivery to a consumer,
// with dedupe.outcome claimed, retry or duplicate), printed one line per
// span as each ends:
//
//	go run ./examples/telemetry [-orders 3] [-dup 0.34] [-fail 0.34] [-keep-schema]
//
// The SDK is configured from the standard variables by otelsetup (through
// package otelkit, which the other examples use too): OTEL_TRACES_EXPORTER
// defaults to console here (set it to otlp, with OTEL_EXPORTER_OTLP_ENDPOINT,
// to send the traces to a collector instead), and OTEL_METRICS_EXPORTER
// (console, otlp, prometheus) adds the metrics.
//
// PostgreSQL is found through -database-url, else DATABASE_URL, else at
// postgres://postgres@127.0.0.1:5432/test; the demo works in a schema of its
// own and drops it at exit unless -keep-schema. It exits 1 if the effects do
// not equal the unique orders, 2 if PostgreSQL cannot be reached or the run
// fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe/examples/exampledb"
	"github.com/exactlyonce/dedupe/examples/otelkit"
	"github.com/exactlyonce/dedupe/examples/quickstart/demo"
)

func main() {
	fmt.Println("dedupe quickstart, with OpenTelemetry")
	if os.Getenv("OTEL_TRACES_EXPORTER") == "" {
		os.Setenv("OTEL_TRACES_EXPORTER", "console")
	}
	var o demo.Options
	fs := flag.NewFlagSet("telemetry", flag.ContinueOnError)
	url := exampledb.Flag(fs, os.Getenv)
	fs.IntVar(&o.Orders, "orders", 3, "unique orders to publish")
	fs.Float64Var(&o.DupRate, "dup", 0.34, "share of extra duplicate messages, re-sent under new Nats-Msg-Ids")
	fs.Float64Var(&o.FailRate, "fail", 0.34, "share of orders whose first attempt fails (and is redelivered)")
	fs.IntVar(&o.Consumers, "consumers", 2, "concurrent consumers")
	fs.IntVar(&o.Workers, "workers", 2, "workers per consumer")
	exampledb.KeepSchemaVar(fs, &o.KeepSchema)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	o.DatabaseURL, o.DatabaseSource = *url, exampledb.Source(*url, os.Getenv)
	o.Logger = slog.New(slog.DiscardHandler)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, o))
}

// run runs the demo under OpenTelemetry and returns the exit code.
func run(ctx context.Context, o demo.Options) int {
	if err := exampledb.Check(ctx, o.DatabaseURL); err != nil {
		fmt.Fprintln(os.Stderr, "telemetry:", err)
		return 2
	}
	tel, err := otelkit.Start(ctx, otelkit.Options{Service: "dedupe-quickstart", OutboxSystem: "nats"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "telemetry: OpenTelemetry:", err)
		return 2
	}
	o.Observer = tel.Observer
	tracer := tel.TracerProvider.Tracer("github.com/exactlyonce/dedupe/examples/telemetry")
	o.Place = func(ctx context.Context, id string) (context.Context, func()) {
		ctx, span := tracer.Start(ctx, "place order", trace.WithAttributes(attribute.String("order.id", id)))
		return ctx, func() { span.End() }
	}
	o.Schema = demo.NewSchemaName()
	demo.PrintHeader(os.Stdout, o)
	fmt.Println("  spans, one line each as it ends: time, trace, span <- parent, kind, duration, name, attributes")
	rep, err := demo.Run(ctx, o)
	if serr := tel.Shutdown(context.WithoutCancel(ctx)); serr != nil { // flushes the spans
		fmt.Fprintln(os.Stderr, "telemetry: OpenTelemetry:", serr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "telemetry:", err)
		return 2
	}
	fmt.Println()
	rep.Print(os.Stdout)
	if !rep.OK() {
		return 1
	}
	return 0
}
