package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/internal/amqptest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// TestConnectionsCutMidRunNothingLostOrDoubled cuts the runners' broker
// connections every 40 committed effects while two runners work through
// messages with 30% duplicates: the runners reconnect, work whose channel
// died is not acked, its redelivery is absorbed, and every key has exactly
// one effect.
func TestConnectionsCutMidRunNothingLostOrDoubled(t *testing.T) {
	b := setup(t, setupOpts{})
	proxy := amqptest.NewProxy(t)
	cfg := fastConfig()
	cfg.Workers = 4
	var handled atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		// Paced by progress, whatever the machine's speed: every 40th
		// handling cuts the runners' broker connections while its own
		// transaction is open (its ack then finds the channel dead, and the
		// redelivery is absorbed). The effect count below also polls for a
		// cut every 40 effects, but a fast machine can finish between polls.
		if handled.Add(1)%40 == 0 {
			proxy.Cut()
		}
		return insertEffect(ctx, tx, d)
	}
	stop1 := run(t, newRunner(t, b, proxy.URL(), cfg, h))
	stop2 := run(t, newRunner(t, b, proxy.URL(), cfg, h))

	const unique = 300
	var msgs []string
	for i := range unique {
		msgs = append(msgs, fmt.Sprintf("order-%d", i))
		if rand.IntN(10) < 3 {
			msgs = append(msgs, fmt.Sprintf("order-%d", i))
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	go func() {
		for _, id := range msgs {
			b.publish(t, id, "x")
		}
	}()
	next := 40
	waitFor(t, 90*time.Second, "every key's effect", func() bool {
		n := b.effects(t)
		if n >= next && n < unique {
			proxy.Cut() // paced by progress: every 40 committed effects
			next = n + 40
		}
		return b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'complete'") == unique
	})
	b.settled(t)
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if proxy.Cuts() < 3 {
		t.Fatalf("only %d cuts happened; the test did not exercise reconnects", proxy.Cuts())
	}
	if n := amqptest.Count(t, b.conn, b.queue); n != 0 {
		t.Fatalf("%d messages left in the queue, want 0", n)
	}
	if n := b.effects(t); n != unique {
		t.Fatalf("effects = %d, want %d", n, unique)
	}
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != unique {
		t.Fatalf("distinct effects = %d, want %d", n, unique)
	}
	t.Logf("%d messages (%d unique), %d cuts, %d handler runs", len(msgs), unique, proxy.Cuts(), handled.Load())
}

// childEnv names the environment with which the test binary runs as a
// runner process for TestKilledRunnerUnackedAbsorbedAfterRedelivery.
const childEnv = "DEDUPEAMQP_TEST_CHILD"

// TestKilledRunnerUnackedAbsorbedAfterRedelivery runs a runner in a child
// process whose acks the proxy in front of the broker holds back, so that
// every message it processes is committed and unacked; then SIGKILLs it.
// The broker redelivers them all to a second runner, which acks them as
// duplicates without running the handler: one effect each.
func TestKilledRunnerUnackedAbsorbedAfterRedelivery(t *testing.T) {
	b := setup(t, setupOpts{})
	proxy := amqptest.NewProxy(t)
	const n = 20
	for i := range n {
		b.publish(t, fmt.Sprintf("order-%d", i), "x")
	}
	proxy.Hold() // from now on the child's acks never reach the broker
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "CHILD_AMQP_URL="+proxy.URL(), "CHILD_DB_URL="+b.db.URL, "CHILD_QUEUE="+b.queue)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	waitFor(t, 60*time.Second, "the child to commit every message", func() bool { return b.effects(t) == n })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waited = true
	proxy.Cut() // the child's connection ends with it
	waitFor(t, 20*time.Second, "the child's deliveries back in the queue", func() bool {
		return amqptest.Count(t, b.conn, b.queue) == n
	})

	obs := observetest.New()
	b.inbox = observedInbox(t, b, obs)
	var ran atomic.Int64
	stop := run(t, newRunner(t, b, "", fastConfig(), func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		ran.Add(1)
		return insertEffect(ctx, tx, d)
	}))
	waitFor(t, 20*time.Second, "every redelivery absorbed", func() bool { return obs.Handled(dedupe.OutcomeDuplicate) == n })
	b.settled(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if ran.Load() != 0 {
		t.Fatalf("the handler ran %d times on redeliveries, want 0", ran.Load())
	}
	if got := b.effects(t); got != n {
		t.Fatalf("effects = %d, want %d", got, n)
	}
}

// runChild is the child process of
// TestKilledRunnerUnackedAbsorbedAfterRedelivery: a runner until killed.
func runChild() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("CHILD_DB_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	r, err := dedupeamqp.New(inbox, os.Getenv("CHILD_AMQP_URL"), os.Getenv("CHILD_QUEUE"),
		dedupeamqp.Config{Key: dedupeamqp.HeaderKey(orderIDHdr), Workers: 4, Prefetch: 32}, insertEffect)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
