// Command bench measures dedupe against the hand-written equivalent that does
// the same work, side by side on the local PostgreSQL: Consumer.Handle for new
// keys and for duplicates (against a hand-written transaction that also reads
// the taken key's row to classify it), the same two over database/sql (pgx's
// stdlib driver, against the same hand-written transaction in a *sql.Tx),
// Inbox.ClaimBatch, the httpidem
// middleware for new requests and replays (against a hand-written handler
// that also stores and replays its response), and, with in-process brokers,
// the NATS JetStream runner, the Kafka runner and the outbox relay against
// hand-written consumers and a hand-written relay.
//
// Every row runs -rounds interleaved rounds: in each, the hand-written side
// and the library run for -duration each, in two windows of half of it in
// the order A B B A (which side is A alternating; -rounds is even so each
// side is A in half of them), each after -warmup, so that a ratio compares
// runs that saw the same machine and a drift within a round weighs on both
// sides alike.
// The report gives each side's msgs/s over all rounds, the median and range
// of the rounds' ratios, p50/p99 latencies, and per message each side's
// PostgreSQL round trips (writes to the pool's sockets) and allocations,
// counted by a sequential probe of -probe-ops operations. It then measures
// how Consumer.Handle holds up as the inbox grows (-inbox-rows), and what a
// retention purge of -purge-rows expired keys costs, alone and while
// consumers run.
//
// It works in a private schema of a database on this machine (-database-url, else
// DATABASE_URL, else postgres://postgres@127.0.0.1:5432/test; a remote host
// is refused), which it drops at the end, and stops by itself: every run is
// time-boxed, and the whole run fails after -timeout.
//
// Usage:
//
//	go run ./cmd/bench -markdown                 # 3 rounds of 2s per side and row
//	go run ./cmd/bench -only Handle -rounds 6
//	go run ./cmd/bench -only "inbox size" -inbox-rows 1e5,1e6,1e7
package main

import (
	"context"
	"errors"
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
// code: 0; 1 when a measurement failed (the report then holds the rows
// measured before it); 2 when it could not run.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	rep, err := runAll(ctx, o, stderr)
	code := 0
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		if _, partial := errors.AsType[*partialError](err); !partial {
			return 2
		}
		code = 1
	}
	if o.markdown {
		rep.markdown(stdout)
	} else {
		rep.text(stdout)
	}
	return code
}
