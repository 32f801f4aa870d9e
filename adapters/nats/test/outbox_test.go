package test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/internal/outboxtest"
	"github.com/exactlyonce/dedupe/outbox"
)

// outboxEnv is a migrated schema with an outbox, a JetStream stream ORDERS
// on orders.> with a duplicate window, and a publisher.
type outboxEnv struct {
	db     *dbtest.DB
	outbox *outbox.Outbox
	js     jetstream.JetStream
	stream jetstream.Stream
	pub    *dedupenats.OutboxPublisher
}

func outboxSetup(t *testing.T, nc *nats.Conn) *outboxEnv {
	t.Helper()
	ctx := context.Background()
	db, ob := outboxtest.New(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{Stream: "ORDERS"})
	if err != nil {
		t.Fatal(err)
	}
	return &outboxEnv{db: db, outbox: ob, js: js, stream: st, pub: pub}
}

func (e *outboxEnv) enqueue(t testing.TB, msgs ...outbox.Message) []string {
	t.Helper()
	return outboxtest.Enqueue(t, e.db.Pool, e.outbox, msgs...)
}

// streamMsgs reads every message of the stream in order.
func (e *outboxEnv) streamMsgs(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	info, err := e.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := e.stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func TestOutboxPublisherRolledBackNothingCommittedOnce(t *testing.T) {
	t.Parallel()
	e := outboxSetup(t, natstest.Connect(t, natstest.Server(t)))
	ctx := context.Background()
	relay, err := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders.created", Payload: []byte("never")}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	ids := e.enqueue(t,
		outbox.Message{Topic: "orders.created", Key: "o1", Payload: []byte("a"), Headers: map[string][]string{"Trace": {"x"}}},
		outbox.Message{Topic: "orders.paid", Key: "o1", Payload: []byte("b")},
		outbox.Message{Topic: "orders.created", Key: "o2", Payload: []byte("c")})
	for i, want := range []int{3, 0} {
		if n, err := relay.Cycle(ctx); err != nil || n != want {
			t.Fatalf("cycle %d = %d, %v; want %d", i, n, err, want)
		}
	}
	got := e.streamMsgs(t)
	if len(got) != 3 {
		t.Fatalf("stream holds %d messages, want 3", len(got))
	}
	seen := map[string]*jetstream.RawStreamMsg{}
	for _, m := range got {
		seen[m.Header.Get(jetstream.MsgIDHeader)] = m
	}
	for i, id := range ids {
		if seen[id] == nil {
			t.Fatalf("message %d (%s) missing", i, id)
		}
	}
	if m := seen[ids[0]]; string(m.Data) != "a" || m.Subject != "orders.created" || m.Header.Get("Trace") != "x" {
		t.Fatalf("first = %s %q %v", m.Subject, m.Data, m.Header)
	}
	// A subject no stream captures is refused and retried, never lost: a
	// failure of that message alone (it counts toward its attempts), not an
	// outage that would pause the relay.
	e.enqueue(t, outbox.Message{Topic: "elsewhere"})
	if n, err := relay.Cycle(ctx); n != 0 || err != nil {
		t.Fatalf("unroutable: %d, %v", n, err)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE published_at IS NULL AND attempts = 1"); n != 1 {
		t.Fatalf("pending after one counted attempt = %d", n)
	}
}

// TestOutboxPublisherKilledBeforeMarkDroppedByMsgID: the relay's database
// connection is killed after JetStream acknowledged the batch; the next
// cycle publishes the same IDs again and the stream drops them.
func TestOutboxPublisherKilledBeforeMarkDroppedByMsgID(t *testing.T) {
	t.Parallel()
	e := outboxSetup(t, natstest.Connect(t, natstest.Server(t)))
	ctx := context.Background()
	app := "relay-" + e.db.Schema
	pcfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, _ := outbox.New(pool, outbox.Config{})
	var kill atomic.Bool
	kill.Store(true)
	pub := publisherFunc(func(ctx context.Context, msgs []*outbox.StoredMessage) []error {
		errs := e.pub.Publish(ctx, msgs)
		if kill.CompareAndSwap(true, false) {
			for _, pid := range e.db.BackendPIDs(t, app) {
				e.db.Terminate(t, pid)
			}
		}
		return errs
	})
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{Topic: "orders.created", Key: fmt.Sprint("o", i%4), Payload: []byte(strconv.Itoa(i))})
	}
	e.enqueue(t, msgs...)
	if _, err := relay.Cycle(ctx); err == nil {
		t.Fatal("cycle survived its killed connection")
	}
	for {
		k, err := relay.Cycle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
	}
	if pending := e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE published_at IS NULL"); pending != 0 {
		t.Fatalf("pending = %d", pending)
	}
	if got := len(e.streamMsgs(t)); got != n {
		t.Fatalf("stream holds %d, want %d", got, n)
	}
	if d := e.pub.Duplicates(); d != n {
		t.Fatalf("duplicates dropped by Nats-Msg-Id = %d, want %d", d, n)
	}
}

type publisherFunc func(ctx context.Context, msgs []*outbox.StoredMessage) []error

func (f publisherFunc) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	return f(ctx, msgs)
}

// TestOutboxPublisherTwoRelaysKeepOrder: two relays with LISTEN/NOTIFY
// publish concurrent writers' messages; the stream holds each once, and
// every key in commit order.
func TestOutboxPublisherTwoRelaysKeepOrder(t *testing.T) {
	t.Parallel()
	e := outboxSetup(t, natstest.Connect(t, natstest.Server(t)))
	ctx := context.Background()
	for range 2 {
		r, err := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{BatchSize: 10, PollInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		dbtest.Background(t, "relay", r.Run)
	}
	const writers, each, keys = 4, 30, 5
	var wg sync.WaitGroup
	var mu sync.Mutex
	committed := map[string][]string{} // key → payloads in commit order
	e.db.Exec(t, `CREATE TABLE seq (n int NOT NULL)`)
	e.db.Exec(t, `INSERT INTO seq VALUES (0)`)
	errs := make([]error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprint("o", (w*each+i)%keys)
				var n int
				err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
					id, err := e.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders." + key, Key: key})
					if err != nil {
						return err
					}
					if err := tx.QueryRow(ctx, `UPDATE seq SET n = n + 1 RETURNING n`).Scan(&n); err != nil {
						return err
					}
					_, err = tx.Exec(ctx, `UPDATE dedupe_outbox SET payload = $2 WHERE message_id = $1`, id, []byte(strconv.Itoa(n)))
					return err
				})
				if err != nil {
					errs[w] = err
					return
				}
				mu.Lock()
				committed[key] = append(committed[key], strconv.Itoa(n))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	dbtest.WaitFor(t, 20*time.Second, "all published", func() bool {
		return e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE published_at IS NULL") == 0
	})
	got := e.streamMsgs(t)
	if len(got) != writers*each {
		t.Fatalf("stream holds %d, want %d", len(got), writers*each)
	}
	perKey := map[string][]string{}
	for _, m := range got {
		perKey[m.Subject[len("orders."):]] = append(perKey[m.Subject[len("orders."):]], string(m.Data))
	}
	for k, want := range committed {
		// Commit order within a key is the order of the counter values.
		slices.SortFunc(want, func(a, b string) int {
			x, _ := strconv.Atoi(a)
			y, _ := strconv.Atoi(b)
			return cmp.Compare(x, y)
		})
		if fmt.Sprint(perKey[k]) != fmt.Sprint(want) {
			t.Fatalf("key %s: stream order %v, commit order %v", k, perKey[k], want)
		}
	}
}

// TestOutboxPublisherBrokerDownThenAllArrive stops the NATS server while
// messages are committed and restarts it (same port, same store): the
// messages wait in the outbox and all arrive, each once, none parked. The
// publisher's health check (a ping on its connection) tells the relay that
// the server is gone, so a backlog of one key, whose cycles the relay alone
// cannot tell from that message failing, parks nothing either.
func TestOutboxPublisherBrokerDownThenAllArrive(t *testing.T) {
	t.Parallel()
	for _, keys := range []int{1, 5} {
		t.Run(fmt.Sprintf("%d keys", keys), func(t *testing.T) {
			t.Parallel()
			natsDownThenAllArrive(t, keys)
		})
	}
}

func natsDownThenAllArrive(t *testing.T, keys int) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	start := func() *server.Server {
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats not ready")
		}
		return s
	}
	srv := start()
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e := outboxSetup(t, nc)
	var failures outboxtest.FailedPublishes
	relay, err := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{PollInterval: 50 * time.Millisecond,
		PublishTimeout: 500 * time.Millisecond, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxAttempts: 2,
		Observer: &failures})
	if err != nil {
		t.Fatal(err)
	}
	dbtest.Background(t, "relay", relay.Run)
	e.enqueue(t, outbox.Message{Topic: "orders.created", Key: "before"})
	dbtest.WaitFor(t, 5*time.Second, "first message", func() bool { return len(e.streamMsgs(t)) == 1 })

	srv.Shutdown()
	srv.WaitForShutdown()
	const n = 40
	for i := range n {
		e.enqueue(t, outbox.Message{Topic: "orders.created", Key: fmt.Sprint("k", i%keys), Payload: []byte(strconv.Itoa(i))})
	}
	// More failed publishes than MaxAttempts allows one message.
	dbtest.WaitFor(t, 10*time.Second, "failed publishes while down", func() bool { return failures.Load() >= 5 })
	if err := e.pub.CheckHealth(context.Background()); err == nil {
		t.Fatal("health check with the server down = nil, want an error")
	}
	if p := e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL"); p != 0 {
		t.Fatalf("outage parked %d messages", p)
	}
	srv = start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	dbtest.WaitFor(t, 20*time.Second, "the health check to pass once the client reconnected", func() bool {
		return e.pub.CheckHealth(context.Background()) == nil
	})
	dbtest.WaitFor(t, 20*time.Second, "all messages after restart", func() bool {
		return e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE published_at IS NULL") == 0
	})
	if got := len(e.streamMsgs(t)); got != n+1 {
		t.Fatalf("stream holds %d, want %d", got, n+1)
	}
}

// BenchmarkOutboxRelay measures the outbox from commit to JetStream ack: 4
// writers commit one message per transaction (with one business row) while
// one relay publishes, woken by LISTEN/NOTIFY (outbox-notify) or polling
// every 20ms with a WithoutNotify outbox (outbox-poll-20ms). It reports
// msgs/s end to end, commits/s of the writers, the latency from commit to
// broker ack (p50, p99), and the throughput ratio to the hand-written dual
// write run first in the same process (direct: commit, then a synchronous
// js.Publish, which loses the message if the process dies in between).
func BenchmarkOutboxRelay(b *testing.B) {
	srv := natstest.Server(b)
	nc := natstest.Connect(b, srv)
	ctx := context.Background()
	const writers = 4
	var direct, viaOutbox float64

	b.Run("direct", func(b *testing.B) {
		e := outboxBenchSetup(b, nc)
		b.ResetTimer()
		start := time.Now()
		outboxBenchWriters(b, writers, func(i int) error {
			if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO effects (n) VALUES ($1)`, i)
				return err
			}); err != nil {
				return err
			}
			_, err := e.js.Publish(ctx, "orders.created", []byte(strconv.Itoa(i)), jetstream.WithMsgID(nuidLike(i)))
			return err
		})
		direct = float64(b.N) / time.Since(start).Seconds()
		b.ReportMetric(direct, "msgs/s")
	})

	runOutbox := func(b *testing.B, quiet bool, poll time.Duration) {
		e := outboxBenchSetup(b, nc)
		var (
			mu        sync.Mutex
			committed = make(map[string]time.Time, b.N)
			lat       = make([]time.Duration, 0, b.N)
			acked     atomic.Int64
		)
		pub := publisherFunc(func(ctx context.Context, msgs []*outbox.StoredMessage) []error {
			errs := e.pub.Publish(ctx, msgs)
			now := time.Now()
			mu.Lock()
			for i, m := range msgs {
				if errs == nil || errs[i] == nil {
					lat = append(lat, now.Sub(committed[m.ID]))
					acked.Add(1)
				}
			}
			mu.Unlock()
			return errs
		})
		ob := e.outbox
		if quiet {
			ob = ob.WithoutNotify()
		}
		relay, err := outbox.NewRelay(e.outbox, pub, outbox.RelayConfig{PollInterval: poll})
		if err != nil {
			b.Fatal(err)
		}
		defer dbtest.Background(b, "relay", relay.Run)()
		time.Sleep(50 * time.Millisecond) // LISTEN established
		b.ResetTimer()
		start := time.Now()
		outboxBenchWriters(b, writers, func(i int) error {
			tx, err := e.db.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			if _, err := tx.Exec(ctx, `INSERT INTO effects (n) VALUES ($1)`, i); err != nil {
				return err
			}
			id, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders.created", Payload: []byte(strconv.Itoa(i))})
			if err != nil {
				return err
			}
			mu.Lock()
			committed[id] = time.Now()
			mu.Unlock()
			return tx.Commit(ctx)
		})
		writersDone := time.Since(start)
		deadline := time.Now().Add(30 * time.Second)
		for acked.Load() < int64(b.N) {
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d acked", acked.Load(), b.N)
			}
			time.Sleep(time.Millisecond)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		rate := float64(b.N) / elapsed.Seconds()
		if !quiet {
			viaOutbox = rate
		}
		mu.Lock()
		slices.Sort(lat)
		p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
		mu.Unlock()
		b.ReportMetric(rate, "msgs/s")
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(b.N)/writersDone.Seconds(), "commits/s")
		if direct > 0 {
			b.ReportMetric(rate/direct, "x-direct")
		}
	}
	b.Run("outbox-notify", func(b *testing.B) { runOutbox(b, false, time.Second) })
	b.Run("outbox-poll-20ms", func(b *testing.B) { runOutbox(b, true, 20*time.Millisecond) })
	// The relay alone: a committed backlog of b.N messages (100 keys) drained
	// by one relay with batches of 100.
	b.Run("relay-drain", func(b *testing.B) {
		e := outboxBenchSetup(b, nc)
		for lo := 0; lo < b.N; lo += 500 {
			var msgs []outbox.Message
			for i := lo; i < min(lo+500, b.N); i++ {
				msgs = append(msgs, outbox.Message{Topic: "orders.created", Key: "k" + strconv.Itoa(i%100), Payload: []byte(strconv.Itoa(i))})
			}
			e.enqueue(b, msgs...)
		}
		relay, err := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{DisableListen: true})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		for published := 0; published < b.N; {
			n, err := relay.Cycle(ctx)
			if err != nil {
				b.Fatal(err)
			}
			published += n
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	if direct > 0 && viaOutbox > 0 {
		b.Logf("outbox/direct throughput ratio: %.2f (outbox %.0f msgs/s, direct dual write %.0f msgs/s)", viaOutbox/direct, viaOutbox, direct)
	}
}

func outboxBenchSetup(b *testing.B, nc *nats.Conn) *outboxEnv {
	b.Helper()
	ctx := context.Background()
	db, ob := outboxtest.New(b)
	db.Exec(b, `CREATE TABLE effects (n int NOT NULL)`)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	_ = js.DeleteStream(ctx, "ORDERS") // from the previous round
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	pub, _ := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{Stream: "ORDERS"})
	return &outboxEnv{db: db, outbox: ob, js: js, stream: st, pub: pub}
}

// outboxBenchWriters runs op for i in [0, b.N) on n goroutines.
func outboxBenchWriters(b *testing.B, n int, op func(i int) error) {
	var next atomic.Int64
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(i); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
}

func nuidLike(i int) string {
	return "direct-" + strconv.Itoa(i) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// A service publishes its outbox to JetStream. The stream's duplicate window
// (Duplicates) must outlast the relay's retries for Nats-Msg-Id to drop a
// re-send; consumers using DefaultKey claim the same ID in their inbox.
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
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS",
		Subjects: []string{"orders.>"}, Duplicates: 10 * time.Minute}); err != nil {
		log.Fatal(err)
	}

	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{Stream: "ORDERS"})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	// Handlers elsewhere call ob.Enqueue(ctx, tx, outbox.Message{Topic:
	// "orders.placed", Key: orderID, Payload: body}) in their transaction.
	if err := relay.Run(ctx); err != nil { // until Ctrl-C
		log.Fatal(err)
	}
}

// TestOutboxPublisherOversizedParkedOthersPublished: a message over the
// server's max payload can never be published; it is parked at once with its
// error, visible to operators, and the rest of its batch is published.
func TestOutboxPublisherOversizedParkedOthersPublished(t *testing.T) {
	t.Parallel()
	e := outboxSetup(t, natstest.Connect(t, natstest.Server(t)))
	ctx := context.Background()
	relay, err := outbox.NewRelay(e.outbox, e.pub, outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := e.enqueue(t,
		outbox.Message{Topic: "orders.created", Key: "a", Payload: []byte("a")},
		outbox.Message{Topic: "orders.created", Key: "big", Payload: make([]byte, 2<<20)},
		outbox.Message{Topic: "orders.created", Key: "b", Payload: []byte("b")})
	if n, err := relay.Cycle(ctx); n != 2 {
		t.Fatalf("cycle published %d (err %v), want 2", n, err)
	}
	got := e.streamMsgs(t)
	if len(got) != 2 || got[0].Header.Get(jetstream.MsgIDHeader) != ids[0] || got[1].Header.Get(jetstream.MsgIDHeader) != ids[2] {
		t.Fatalf("stream holds %d messages, want a and b", len(got))
	}
	parked, err := e.outbox.Parked(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].ID != ids[1] || parked[0].Attempt != 1 || !strings.Contains(parked[0].LastError, "maximum payload") {
		t.Fatalf("parked = %+v, want the oversized message after one attempt with its error", parked)
	}
	if n, err := relay.Cycle(ctx); n != 0 || err != nil {
		t.Fatalf("next cycle = %d, %v; want nothing left to publish", n, err)
	}
}
