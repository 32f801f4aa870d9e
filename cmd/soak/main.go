// Command soak drives many messages, with duplicates, through each of
// dedupe's transports while injecting faults at random, and then audits the
// database: every unique input must have exactly one effect, none may be
// missing, and no key may be left in flight.
//
// Transports: handle (Consumer.Handle), leased (Begin/CompleteTx), batch
// (ClaimBatch) on an in-memory at-least-once broker; nats (JetStream
// runner), kafka and kafka-batch (kafka-go runner on kfake), webhook
// (Standard Webhooks receiver), httpidem (Idempotency-Key middleware) and
// outbox (Enqueue, Relay to JetStream, runner). naive, which writes effects
// without the inbox, is there to prove that the audit fails.
//
// Faults: handler errors and panics after the effect was written,
// pg_terminate_backend on the consumer's connections (found by their
// application_name), a worker subprocess (the soak re-executes itself)
// killed with SIGKILL inside a transaction and restarted, broker
// redeliveries of acknowledged messages, and leased holders that die or
// outlive their lease.
//
// It prints one line per transport,
//
//	transport=handle inputs=20000 unique=16702 effects=16702 missing=0 duplicated=0 faults=1234 ...
//
// and exits 1 when any audit fails, 2 when it cannot run. It works in a
// private schema of the database it is given (-dsn, else DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/test), which it drops at the end.
//
// Usage:
//
//	go run ./cmd/soak -n 20000 -dup 0.2 -transports handle,leased
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
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes of run.
const (
	exitOK       = 0
	exitMismatch = 1 // an audit failed
	exitError    = 2 // the soak could not run
)

// run runs the soak with the command-line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseOptions(args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return exitError
	}
	s, err := newSoak(ctx, opts, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return exitError
	}
	defer s.close()
	code := exitOK
	for _, name := range opts.transports {
		rep, err := s.runTransport(ctx, name)
		if err != nil {
			fmt.Fprintf(stderr, "soak: transport %s: %v\n", name, err)
			code = max(code, exitError)
		}
		if rep != nil {
			fmt.Fprintln(stdout, rep)
			if !rep.ok() {
				code = max(code, exitMismatch)
			}
		}
	}
	return code
}
