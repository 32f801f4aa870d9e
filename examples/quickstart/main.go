// Command quickstart shows dedupe end to end on one machine with only Go and
// PostgreSQL: it starts an in-process NATS server with JetStream, places a
// batch of orders with deliberate duplicates (each enqueued in the
// transactional outbox and published by its relay), lets several concurrent
// consumers handle them while some attempts fail and one consumer loses its
// connection mid-run (so messages are redelivered), and prints how many
// deliveries there were and how many effects were written: exactly one per
// unique order.
//
//	go run ./examples/quickstart [-orders 200] [-dup 0.25] [-consumers 3] [-workers 4] [-v]
//
// With OpenTelemetry turned on from the standard environment variables
// (OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT),
// each order is one trace from its placement to its processing: "place
// order" → "create orders.created" (the enqueue) → "send orders.created"
// (the relay) and "process orders.created" (the consumer, once per delivery,
// with dedupe.outcome claimed, retry or duplicate):
//
//	OTEL_TRACES_EXPORTER=console go run ./examples/quickstart -orders 3
//
// PostgreSQL is found through DATABASE_URL, else at
// postgres://postgres@127.0.0.1:5432/test, else in a container started with
// testcontainers when Docker runs. The quickstart works in a schema of its
// own and drops it when it ends. It exits 1 if the effects do not equal the
// unique orders.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"

	"github.com/exactlyonce/dedupe/examples/telemetry"
)

func main() {
	var o options
	flag.IntVar(&o.Orders, "orders", 200, "unique orders to publish")
	flag.Float64Var(&o.DupRate, "dup", 0.25, "share of extra duplicate messages, re-sent under new Nats-Msg-Ids")
	flag.Float64Var(&o.FailRate, "fail", 0.1, "share of orders whose first attempt fails (and is redelivered)")
	flag.IntVar(&o.Consumers, "consumers", 3, "concurrent consumer processes (each with its own NATS connection)")
	flag.IntVar(&o.Workers, "workers", 4, "workers per consumer")
	verbose := flag.Bool("v", false, "log every message")
	flag.Parse()
	o.CrashOne = true
	o.Logger = slog.New(slog.DiscardHandler)
	if *verbose {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	tel, err := telemetry.Start(ctx, telemetry.Options{Service: "dedupe-quickstart", OutboxSystem: "nats"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart: OpenTelemetry:", err)
		os.Exit(2)
	}
	o.Observer, o.TracerProvider = tel.Observer, tel.TracerProvider
	url, source, cleanup, err := findDatabase(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(2)
	}
	o.DatabaseURL, o.DatabaseSource = url, source
	rep, err := run(ctx, o)
	cleanup()
	if serr := tel.Shutdown(context.WithoutCancel(ctx)); serr != nil { // flushes the spans
		fmt.Fprintln(os.Stderr, "quickstart: OpenTelemetry:", serr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(2)
	}
	rep.print(os.Stdout)
	if !rep.ok() {
		os.Exit(1)
	}
}

// print writes the report.
func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "dedupe quickstart\n")
	fmt.Fprintf(w, "  PostgreSQL   %s (schema %s, dropped at exit)\n", r.DatabaseSource, r.Schema)
	fmt.Fprintf(w, "  NATS         in-process JetStream: stream ORDERS, durable %q\n", durableName)
	crash := ""
	if r.Crashed >= 0 {
		crash = fmt.Sprintf("; consumer %d loses its NATS connection mid-run", r.Crashed+1)
	}
	fmt.Fprintf(w, "  consumers    %d x %d workers%s\n\n", r.Consumers, r.Workers, crash)
	fmt.Fprintf(w, "  unique orders         %6d\n", r.Unique)
	fmt.Fprintf(w, "  messages published    %6d   (%d deliberate duplicates under new Nats-Msg-Ids)\n", r.Published, r.Published-r.Unique)
	fmt.Fprintf(w, "  deliveries handled    %6d   (%d redeliveries: %d after a failed attempt, %d after the lost connection or shutdown)\n",
		r.Deliveries, r.Deliveries-r.Published, r.Retries, r.Deliveries-r.Published-r.Retries)
	fmt.Fprintf(w, "  duplicates absorbed   %6d\n", r.Duplicates)
	verdict := "== unique orders: exactly once"
	if !r.ok() {
		verdict = fmt.Sprintf("!= unique orders (%d distinct): MISMATCH", r.DistinctEffects)
	}
	fmt.Fprintf(w, "  effects written       %6d   %s\n", r.Effects, verdict)
	fmt.Fprintf(w, "  time taken            %6.2fs\n", r.Elapsed.Seconds())
}
