package test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/kafkatest"
	"github.com/exactlyonce/dedupe/internal/outboxtest"
	"github.com/exactlyonce/dedupe/outbox"
)

type outboxEnv struct {
	db     *dbtest.DB
	outbox *outbox.Outbox
	pub    *dedupekafka.OutboxPublisher
}

func outboxSetup(t *testing.T, brokers []string) *outboxEnv {
	t.Helper()
	db, ob := outboxtest.New(t)
	w := dedupekafka.NewOutboxWriter(brokers...)
	w.Transport = &kafka.Transport{}
	w.WriteBackoffMin, w.WriteBackoffMax, w.MaxAttempts = 10*time.Millisecond, 50*time.Millisecond, 2
	t.Cleanup(func() { _ = w.Close(); w.Transport.(*kafka.Transport).CloseIdleConnections() })
	pub, err := dedupekafka.NewOutboxPublisher(w, dedupekafka.OutboxPublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &outboxEnv{db: db, outbox: ob, pub: pub}
}

func (e *outboxEnv) enqueue(t *testing.T, msgs ...outbox.Message) []string {
	t.Helper()
	return outboxtest.Enqueue(t, e.db.Pool, e.outbox, msgs...)
}

// consumeAll reads topic from the start until want records arrived (or the
// deadline passed) and a short quiet period shows no more.
func consumeAll(t *testing.T, brokers []string, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	deadline := time.Now().Add(15 * time.Second)
	quietUntil := time.Time{}
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
		if len(out) >= want {
			if quietUntil.IsZero() {
				quietUntil = time.Now().Add(300 * time.Millisecond)
			} else if time.Now().After(quietUntil) {
				break
			}
		}
	}
	return out
}

func header(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

func TestOutboxPublisherRefusesUnsafeWriters(t *testing.T) {
	t.Parallel()
	for name, w := range map[string]*kafka.Writer{
		"acks one":    {Addr: kafka.TCP("x"), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireOne},
		"round robin": {Addr: kafka.TCP("x"), RequiredAcks: kafka.RequireAll},
		"async":       {Addr: kafka.TCP("x"), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, Async: true},
		"topic":       {Addr: kafka.TCP("x"), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, Topic: "t"},
	} {
		if _, err := dedupekafka.NewOutboxPublisher(w, dedupekafka.OutboxPublisherConfig{}); !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// TestOutboxPublisherExactlyOnceInKeyOrder: rolled back → nothing; committed
// by two relays at once → each message once, with its ID in the message-id
// header, every key in commit order on its partition.
func TestOutboxPublisherExactlyOnceInKeyOrder(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Cluster(t, 3, "orders")
	e := outboxSetup(t, brokers)
	ctx := context.Background()

	tx, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "k0", Payload: []byte("rolled back")}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)

	r1, err := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{DisableListen: true, BatchSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{DisableListen: true, BatchSize: 8})
	const n, keys = 60, 6
	var ids []string
	for i := range n {
		ids = append(ids, e.enqueue(t, outbox.Message{Topic: "orders", Key: fmt.Sprint("k", i%keys),
			Payload: []byte(strconv.Itoa(i)), Headers: map[string][]string{"Source": {"test"}}})...)
	}
	var total atomic.Int64
	errs := make([]error, 2)
	done := make(chan int, 2)
	for i, r := range []*outbox.Relay{r1, r2} {
		go func() {
			for {
				k, err := r.Cycle(ctx)
				if err != nil {
					errs[i] = err
				}
				if k == 0 || err != nil {
					done <- i
					return
				}
				total.Add(int64(k))
			}
		}()
	}
	<-done
	<-done
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// One relay may have stopped on an empty cycle while the other still
	// held keys; drain what is left.
	for {
		k, err := r1.Cycle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
		total.Add(int64(k))
	}
	if total.Load() != n {
		t.Fatalf("relays published %d, want %d", total.Load(), n)
	}
	recs := consumeAll(t, brokers, "orders", n)
	if len(recs) != n {
		t.Fatalf("topic holds %d records, want %d", len(recs), n)
	}
	seen := map[string]int{}
	last := map[string]int{}
	partOf := map[string]int32{}
	for _, r := range recs {
		seen[header(r, "message-id")]++
		if header(r, "Source") != "test" {
			t.Fatalf("headers = %v", r.Headers)
		}
		k := string(r.Key)
		v, _ := strconv.Atoi(string(r.Value))
		if p, ok := partOf[k]; ok && p != r.Partition {
			t.Fatalf("key %s on partitions %d and %d", k, p, r.Partition)
		}
		partOf[k] = r.Partition
		if prev, ok := last[k]; ok && v <= prev {
			t.Fatalf("key %s: %d after %d", k, v, prev)
		}
		last[k] = v
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("message %s in topic %d times", id, seen[id])
		}
	}
}

// TestOutboxPublisherBrokerDownThenAllArrive stops the broker while messages
// are committed and starts a new one on the same port: none is parked and
// all arrive. The publisher's health check tells the relay that the broker
// is gone, so even a backlog of one key (each cycle's failures one key's,
// which the relay alone cannot tell from that message failing) parks
// nothing: without it the one-key run parks its first message after
// MaxAttempts, and .ci/stress saw the four-key run park one when the
// enqueues came slowly enough for cycles of one key.
func TestOutboxPublisherBrokerDownThenAllArrive(t *testing.T) {
	t.Parallel()
	for _, keys := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d keys", keys), func(t *testing.T) {
			t.Parallel()
			brokerDownThenAllArrive(t, keys)
		})
	}
}

func brokerDownThenAllArrive(t *testing.T, keys int) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	start := func() *kfake.Cluster {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(2, "orders"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := start()
	brokers := c.ListenAddrs()
	e := outboxSetup(t, brokers)
	var failures outboxtest.FailedPublishes
	relay, err := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{PollInterval: 50 * time.Millisecond,
		PublishTimeout: time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxAttempts: 2,
		Observer: &failures})
	if err != nil {
		t.Fatal(err)
	}
	defer dbtest.Background(t, "relay", relay.Run)()
	c.Close()
	const n = 30
	for i := range n {
		e.enqueue(t, outbox.Message{Topic: "orders", Key: fmt.Sprint("k", i%keys), Payload: []byte(strconv.Itoa(i))})
	}
	// More failed publishes than MaxAttempts allows one message.
	dbtest.WaitFor(t, 10*time.Second, "4 failed publishes while down", func() bool { return failures.Load() >= 4 })
	if err := e.pub.CheckHealth(context.Background()); err == nil {
		t.Fatal("health check of a stopped broker = nil, want an error")
	}
	if p := e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL"); p != 0 {
		t.Fatalf("outage parked %d", p)
	}
	c = start()
	t.Cleanup(c.Close)
	// Healthy again once the writer's transport refreshed its metadata
	// (until then kafka-go fails every write, which the check reports).
	dbtest.WaitFor(t, 20*time.Second, "the health check to pass with the broker back", func() bool {
		return e.pub.CheckHealth(context.Background()) == nil
	})
	dbtest.WaitFor(t, 20*time.Second, "every message published after the broker came back", func() bool {
		return e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE published_at IS NULL") == 0
	})
	recs := consumeAll(t, brokers, "orders", n)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[header(r, "message-id")] = true
	}
	if len(seen) != n {
		t.Fatalf("distinct messages after restart = %d (records %d), want %d", len(seen), len(recs), n)
	}
}

// TestOutboxPublisherOversizedParkedOthersPublished: a message over the
// writer's BatchBytes can never be written; it is parked at once with its
// error, visible to operators, and the rest of its batch (which kafka-go
// refused with it) is published on a retry.
func TestOutboxPublisherOversizedParkedOthersPublished(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Cluster(t, 1, "orders")
	e := outboxSetup(t, brokers)
	ctx := context.Background()
	relay, err := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{DisableListen: true,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ids := e.enqueue(t,
		outbox.Message{Topic: "orders", Key: "a", Payload: []byte("a")},
		outbox.Message{Topic: "orders", Key: "big", Payload: make([]byte, 2<<20)},
		outbox.Message{Topic: "orders", Key: "b", Payload: []byte("b")})
	published := 0
	dbtest.WaitFor(t, 10*time.Second, "a and b published", func() bool {
		n, _ := relay.Cycle(ctx)
		published += n
		return published == 2
	})
	parked, err := e.outbox.Parked(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].ID != ids[1] || parked[0].Attempt != 1 || !strings.Contains(parked[0].LastError, "Message Size Too Large") {
		t.Fatalf("parked = %+v, want the oversized message after one attempt with its error", parked)
	}
	if st, err := e.outbox.Stats(ctx); err != nil || st.Pending != 0 || st.Parked != 1 {
		t.Fatalf("stats = %+v, %v; want nothing pending and one parked", st, err)
	}
	recs := consumeAll(t, brokers, "orders", 2)
	if len(recs) != 2 || header(recs[0], "message-id") != ids[0] || header(recs[1], "message-id") != ids[2] {
		t.Fatalf("topic holds %d records, want a and b once each", len(recs))
	}
}

// A service publishes its outbox to Kafka; the consumer's inbox claims the
// message-id header (dedupekafka.KeyFromHeaders(msg, "message-id")).
func ExampleNewOutboxPublisher() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	w := dedupekafka.NewOutboxWriter("127.0.0.1:9092")
	defer w.Close()
	pub, err := dedupekafka.NewOutboxPublisher(w, dedupekafka.OutboxPublisherConfig{})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil { // until Ctrl-C
		log.Fatal(err)
	}
}
