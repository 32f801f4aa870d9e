// Command bench measures dedupe against the hand-written equivalent on the
// local PostgreSQL, side by side in the same run: a transaction with the
// effect only, a hand-written claim plus effect, Consumer.Handle, hand-written
// batch SQL and Inbox.ClaimBatch, each for 1, 8 and 32 workers, and the
// NATS JetStream runner, the Kafka runner and the outbox relay against
// hand-written consumers and a hand-written relay. It prints
// throughput, p50/p99 latency and the ratio to the baseline; it then measures
// how the cost grows with the size of the inbox and what a retention purge
// costs the consumers that run meanwhile.
//
// It works in a private schema of the database it is given (-dsn, else
// DATABASE_URL, else postgres://postgres@127.0.0.1:5432/test), which it drops
// at the end. Every row runs for -duration after a -warmup.
//
// Usage:
//
//	go run ./cmd/bench -duration 3s -markdown
//	go run ./cmd/bench -inbox-rows 1e5,1e6,1e7
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the benchmark with the command-line args and returns the exit
// code: 0, or 2 when it could not run.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	rep, err := runAll(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	if o.markdown {
		rep.markdown(stdout)
	} else {
		rep.text(stdout)
	}
	return 0
}
