// Command soak drives many messages, with duplicates, through each of
// dedupe's transports while injecting faults at random, and then audits the
// database: every unique input must end in exactly one visible state (its
// effect committed once, its key failed in the inbox, or a copy in a
// dead-letter destination), the one it was designed for, and no key may be
// left in flight.
//
// Transports: handle (Consumer.Handle), leased (Begin/CompleteTx), starved
// (leased with a pool of -starved-conns connections, four times as many
// consumers, a slow handler and a short lease), poison (Consumer.Handle with
// a small attempt limit, every input designed to fail delivered
// -poison-copies times at once) and batch (ClaimBatch) on an in-memory
// at-least-once broker; nats (JetStream runner), kafka and kafka-batch
// (kafka-go runner on kfake), amqp (RabbitMQ runner on the machine's broker,
// AMQP_URL; its in-process runners' connections cut every 40 effects),
// webhook (Standard Webhooks receiver), httpidem
// (Idempotency-Key middleware) and outbox (Enqueue, Relay to JetStream,
// runner). naive, which writes effects without the inbox, is there to prove
// that the audit fails.
//
// Inputs: m-… ids are ordinary. f-… ids (-poison) are designed to fail: where
// the transport supports it their handler always fails, and they must end
// failed in the inbox (Kafka also dead-letters them), never committed and
// never lost. k-… ids (-keyless) are published without a key on NATS, Kafka
// and RabbitMQ, and must be dead-lettered (Kafka and RabbitMQ also record
// them failed under a dedupekafka-refused/… or dedupeamqp-refused/… key).
// Elsewhere both are ordinary inputs.
//
// Faults: handler errors and panics after the effect was written,
// pg_terminate_backend on the consumer's connections (found by their
// application_name), a PostgreSQL-protocol proxy between the consumers and
// the database that drops the reply to a COMMIT or another statement after
// the server applied it and cuts connections before a statement reaches the
// server, a worker subprocess (the soak re-executes itself) killed with
// SIGKILL inside a transaction and restarted, broker redeliveries of
// acknowledged messages, leased holders that die or outlive their lease, and
// pool starvation. Faults are paced by progress (per statement, per
// delivery, every N committed effects), never by the clock; a run fails only
// when it makes no progress for -idle.
//
// It prints one line per transport,
//
//	transport=handle inputs=20000 unique=16702 effects=16368 missing=0 duplicated=0 faults=1234 committed=16368 failed=334 dead_lettered=0 designed_to_fail=334 wrong_end=0 ...
//
// where committed, failed and dead_lettered count the unique inputs in each
// end state, missing those in none, and wrong_end those in a state they were
// not designed for. The poison transport adds max_attempts, runs_max (the
// most runs of its handler for one input designed to fail),
// unrecorded_runs (runs whose failure record the connection lost under, so
// that the inbox could not count them; Handle reports them) and
// over_attempts (inputs whose recorded runs or stored attempts exceed the
// limit). The transports that call Consumer.Handle in this process (handle,
// poison) add misreported (calls that Handle reported committed whose effect
// is not there, or not committed whose effect is: a lost COMMIT reply taken
// for a rollback) and unknown_outcomes. It exits 1 when any audit fails, 2
// when it cannot run. It works in
// a private schema of the database it is given (-database-url, else DATABASE_URL,
// else postgres://postgres@127.0.0.1:5432/test), which it drops at the end.
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
