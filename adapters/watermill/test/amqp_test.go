package test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupewatermill "github.com/exactlyonce/dedupe/adapters/watermill"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// amqpURL is RabbitMQ's, from AMQP_URL or the machine's default.
func amqpURL(t *testing.T) string {
	u := os.Getenv("AMQP_URL")
	if u == "" {
		u = "amqp://guest:guest@127.0.0.1:5672/"
	}
	c, err := amqp091.Dial(u)
	if err != nil {
		t.Fatalf("RabbitMQ is not answering at %s (%v); these tests need it: set AMQP_URL, or start one with: rabbitmq-server -detached", u, err)
	}
	_ = c.Close()
	return u
}

// queueDepth is how many messages queue holds ready for delivery.
func queueDepth(t *testing.T, url, queue string) int {
	t.Helper()
	c, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// deleteQueue removes queue when the test ends.
func deleteQueue(t *testing.T, url, queue string) {
	t.Cleanup(func() {
		c, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
	})
}

// victimEnv, set in a child process of the test binary, makes TestMain
// run a router (victim) instead of the tests; the parent kills it.
const victimEnv = "DEDUPE_WATERMILL_VICTIM"

// victim runs a router with the dedupe middleware on the queue and
// database the environment names, printing "ready" once it consumes, until
// the process is killed.
func victim() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("VICTIM_DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	mw, err := dedupewatermill.New[pgx.Tx](inbox, dedupewatermill.Config{Scope: "shipping"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	logger := watermill.NopLogger{}
	cfg := amqp.NewDurableQueueConfig(os.Getenv("VICTIM_AMQP_URL"))
	cfg.Consume.Qos.PrefetchCount = 8
	sub, err := amqp.NewSubscriber(cfg, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r.AddMiddleware(mw.Handler)
	r.AddNoPublisherHandler("h", os.Getenv("VICTIM_QUEUE"), sub, func(msg *message.Message) error {
		time.Sleep(2 * time.Millisecond) // keep some in flight when the kill comes
		return insertEffect(msg)
	})
	go func() {
		<-r.Running()
		fmt.Println("ready")
	}()
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// startVictim starts the victim router in a child process.
func startVictim(t *testing.T, dbURL, amqpURL, queue string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), victimEnv+"=1", "VICTIM_DATABASE_URL="+dbURL, "VICTIM_AMQP_URL="+amqpURL, "VICTIM_QUEUE="+queue)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatal("the victim router did not start in 60s")
	}
	return cmd
}

// Two routers consume one durable RabbitMQ queue (competing consumers),
// one of them in a child process, while every message is published twice
// under its UUID; the child is killed (SIGKILL) mid-run, with messages in
// its handlers, some committed and never acked. Every message's effect
// happens once, and the queue ends empty.
func TestAMQPDuplicatesAndRouterKilled(t *testing.T) {
	url := amqpURL(t)
	obs := observetest.New()
	e := setup(t, obs)
	queue := fmt.Sprintf("dedupe-test-orders-%s", e.db.Schema)
	deleteQueue(t, url, queue)
	pub, err := amqp.NewPublisher(amqp.NewDurableQueueConfig(url), wmLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	otherCfg := amqp.NewDurableQueueConfig(url)
	otherCfg.Consume.Qos.PrefetchCount = 8
	other, err := amqp.NewSubscriber(otherCfg, wmLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	child := startVictim(t, e.db.URL, url, queue)
	stopOther := router(t, newMiddleware(t, e, dedupewatermill.Config{}), other, queue, noPublish(func(msg *message.Message) error {
		time.Sleep(2 * time.Millisecond)
		return insertEffect(msg)
	}), nil, "")

	const n = 300
	published := make(chan error, 1)
	go func() {
		for i := range n {
			for range 2 {
				if err := pub.Publish(queue, message.NewMessage(fmt.Sprintf("order-%d", i), []byte("x"))); err != nil {
					published <- err
					return
				}
			}
		}
		published <- nil
	}()
	dbtest.WaitFor(t, 30*time.Second, "100 effects", func() bool { return e.effects(t) >= 100 })
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	killedAt := e.effects(t)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	dbtest.WaitFor(t, 60*time.Second, "every message's effect", func() bool { return e.effects(t) == n })
	// The child's unacked messages come back to the other router; wait
	// until the queue holds nothing ready and the router is idle.
	dbtest.WaitFor(t, 30*time.Second, "the queue drained", func() bool {
		before := obs.Ended()
		time.Sleep(300 * time.Millisecond)
		return queueDepth(t, url, queue) == 0 && obs.Ended() == before
	})
	stopOther()
	if got := e.effects(t); got != n {
		t.Fatalf("effects = %d, want %d", got, n)
	}
	if got := e.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); got != n {
		t.Fatalf("distinct effects = %d, want %d", got, n)
	}
	if d := queueDepth(t, url, queue); d != 0 {
		t.Fatalf("queue holds %d messages after the routers stopped, want 0", d)
	}
	if killedAt >= n {
		t.Fatalf("the victim was killed after all %d effects; the kill proved nothing", n)
	}
}
