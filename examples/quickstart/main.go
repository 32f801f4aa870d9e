// Command quickstart shows dedupe end to end on one machine with only Go and
// PostgreSQL: it starts an in-process NATS server with JetStream, places a
// batch of orders with deliberate duplicates (each enqueued in the
// transactional outbox and published by its relay), lets several concurrent
// consumers handle them while some attempts fail and one consumer loses its
// connection mid-run (so messages are redelivered), and prints how many
// deliveries there were and how many effects were written: exactly one per
// unique order.
//
//	go run ./examples/quickstart [-orders 200] [-dup 0.25] [-fail 0.1] [-consumers 3] [-workers 4] [-keep-schema] [-v]
//
// PostgreSQL is found through -database-url, else DATABASE_URL, else at
// postgres://postgres@127.0.0.1:5432/test. The quickstart works in a schema
// of its own and drops it when it ends, unless -keep-schema. It exits 1 if
// the effects do not equal the unique orders, 2 if PostgreSQL cannot be
// reached or the run fails.
//
// The same demo with OpenTelemetry traces is examples/telemetry; the
// quickstart carries no OpenTelemetry SDK, so that its first build is
// short.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"github.com/exactlyonce/dedupe/examples/exampledb"
	"github.com/exactlyonce/dedupe/examples/quickstart/demo"
)

func main() {
	fmt.Println("dedupe quickstart") // at once: the first build took long enough
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, o))
}

// parseFlags reads the demo's options from args.
func parseFlags(args []string) (demo.Options, error) {
	var o demo.Options
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	url := exampledb.Flag(fs, os.Getenv)
	fs.IntVar(&o.Orders, "orders", 200, "unique orders to publish")
	fs.Float64Var(&o.DupRate, "dup", 0.25, "share of extra duplicate messages, re-sent under new Nats-Msg-Ids")
	fs.Float64Var(&o.FailRate, "fail", 0.1, "share of orders whose first attempt fails (and is redelivered)")
	fs.IntVar(&o.Consumers, "consumers", 3, "concurrent consumer processes (each with its own NATS connection)")
	fs.IntVar(&o.Workers, "workers", 4, "workers per consumer")
	exampledb.KeepSchemaVar(fs, &o.KeepSchema)
	verbose := fs.Bool("v", false, "log every message")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.CrashOne = true
	o.Logger = slog.New(slog.DiscardHandler)
	if *verbose {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	o.DatabaseURL, o.DatabaseSource = *url, exampledb.Source(*url, os.Getenv)
	return o, nil
}

// run runs the demo and prints its report; it returns the exit code.
func run(ctx context.Context, o demo.Options) int {
	if err := exampledb.Check(ctx, o.DatabaseURL); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		return 2
	}
	o.Schema = demo.NewSchemaName()
	demo.PrintHeader(os.Stdout, o)
	rep, err := demo.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		return 2
	}
	rep.Print(os.Stdout)
	if !rep.OK() {
		return 1
	}
	return 0
}
