package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/outbox"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// Fault kinds, chosen per order by its number. Each fires on the order's
// first attempt (or delivery) at its step, in service A and again in B.
const (
	faultNone     = iota
	faultError    // the handler returns an error: rolled back, redelivered
	faultPanic    // the handler panics: rolled back, redelivered
	faultKillConn // the transaction's connection is killed (pg_terminate_backend) before commit
	faultDropAck  // the process "dies" after commit, before the ack: the broker redelivers after AckWait
	faultWireDup  // the input is published twice on the wire (A) / nothing (B)
	faultKinds
)

// faults remembers which faults already fired.
type faults struct{ fired sync.Map }

// once reports true the first time it is called for (step, id).
func (f *faults) once(step, id string) bool {
	_, loaded := f.fired.LoadOrStore(step+"/"+id, true)
	return !loaded
}

func kindOf(order string) int {
	n, _ := strconv.Atoi(order[len("o"):])
	return n % faultKinds
}

// dropAckConsumer wraps a jetstream.Consumer so that the first DoubleAck of
// chosen messages is lost: as if the process died right after its database
// commit. The broker redelivers those messages after AckWait, for real.
type dropAckConsumer struct {
	jetstream.Consumer
	drop func(m jetstream.Msg) bool
}

func (c dropAckConsumer) Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(batch, opts...)
	if err != nil {
		return b, err
	}
	out := make(chan jetstream.Msg)
	go func() { // ends when the fetch's channel closes
		defer close(out)
		for m := range b.Messages() {
			out <- &dropAckMsg{Msg: m, drop: c.drop}
		}
	}()
	return dropAckBatch{MessageBatch: b, msgs: out}, nil
}

type dropAckBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b dropAckBatch) Messages() <-chan jetstream.Msg { return b.msgs }

type dropAckMsg struct {
	jetstream.Msg
	drop func(m jetstream.Msg) bool
}

var errCrashed = errors.New("e2e: process died before acking")

func (m *dropAckMsg) DoubleAck(ctx context.Context) error {
	if m.drop(m.Msg) {
		return errCrashed
	}
	return m.Msg.DoubleAck(ctx)
}

// service is one side of the chain: its own schema, inbox and consumer.
type service struct {
	db    *dbtest.DB
	inbox *dedupe.Inbox
}

func newService(t *testing.T) *service {
	t.Helper()
	db := dbtest.New(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `CREATE TABLE effects (order_id text NOT NULL)`)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &service{db: db, inbox: inbox}
}

// inject fires the order's fault inside the handler's transaction.
func (s *service) inject(ctx context.Context, tx pgx.Tx, f *faults, step, order string) error {
	switch kindOf(order) {
	case faultError:
		if f.once(step+"/error", order) {
			return fmt.Errorf("%s: injected failure for %s", step, order)
		}
	case faultPanic:
		if f.once(step+"/panic", order) {
			panic(step + ": injected panic for " + order)
		}
	case faultKillConn:
		if f.once(step+"/kill", order) {
			var pid uint32
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			if _, err := s.db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestChainExactlyOnceUnderFaults drives orders through A → outbox → relay →
// JetStream → B with a fault at every step and checks that B's effects are
// exactly the unique orders.
func TestChainExactlyOnceUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for name, subj := range map[string]string{"IN": "in.>", "OUT": "out.>"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, Duplicates: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	consumer := func(stream, durable string, drop func(jetstream.Msg) bool) jetstream.Consumer {
		c, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: durable,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return dropAckConsumer{Consumer: c, drop: drop}
	}
	runCfg := func(key func(jetstream.Msg) (string, error)) dedupenats.Config {
		return dedupenats.Config{Key: key, Workers: 4, Heartbeat: 300 * time.Millisecond,
			Backoff: func(int) time.Duration { return 20 * time.Millisecond }, DrainTimeout: 5 * time.Second,
			MaxAttempts: -1}
	}
	var f faults

	// Service A: claims the order, records its effect and enqueues the
	// follow-up in the same transaction.
	a := newService(t)
	ob, err := outbox.New(a.db.Pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	handleA := func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		order := msg.Headers().Get("Order-Id")
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, order); err != nil {
			return err
		}
		// A stable ID: a retry of the whole handler would enqueue the same one.
		id := dedupe.ClaimFromContext(ctx).DerivedKey("shipment-requested")
		if _, err := ob.Enqueue(ctx, tx, outbox.Message{ID: id, Topic: "out.shipments", Key: order, Payload: []byte(order)}); err != nil {
			return err
		}
		return a.inject(ctx, tx, &f, "a", order)
	}
	dropA := func(m jetstream.Msg) bool {
		o := m.Headers().Get("Order-Id")
		return kindOf(o) == faultDropAck && f.once("a/drop", o)
	}
	newA := func() *dedupenats.Runner {
		r, err := dedupenats.New(a.inbox, consumer("IN", "svc-a", dropA), runCfg(dedupenats.HeaderKey("Order-Id")), handleA)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// The relay of A's outbox, on its own pool so that its connections can
	// be killed after a publish and before the mark.
	pcfg, err := pgxpool.ParseConfig(a.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = "relay-" + a.db.Schema
	pcfg.MaxConns = 4
	relayPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayPool.Close)
	relayOutbox, _ := outbox.New(relayPool, outbox.Config{})
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{Stream: "OUT"})
	if err != nil {
		t.Fatal(err)
	}
	var kills atomic.Int32
	crashy := crashAfterPublish{pub: pub, crash: func() {
		if kills.Add(1) <= 3 {
			for _, pid := range a.db.BackendPIDs(t, "relay-"+a.db.Schema) {
				a.db.Terminate(t, pid)
			}
		}
	}}
	for range 2 {
		relay, err := outbox.NewRelay(relayOutbox, crashy, outbox.RelayConfig{BatchSize: 16, PollInterval: 100 * time.Millisecond,
			MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		dbtest.Background(t, "relay", relay.Run)
	}

	// Service B: consumes the follow-ups, deduplicating by Nats-Msg-Id (the
	// outbox ID).
	b := newService(t)
	handleB := func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		order := string(msg.Data())
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, order); err != nil {
			return err
		}
		return b.inject(ctx, tx, &f, "b", order)
	}
	dropB := func(m jetstream.Msg) bool {
		o := string(m.Data())
		return kindOf(o) == faultDropAck && f.once("b/drop", o)
	}
	rb, err := dedupenats.New(b.inbox, consumer("OUT", "svc-b", dropB), runCfg(nil), handleB)
	if err != nil {
		t.Fatal(err)
	}
	dbtest.Background(t, "B", rb.Run)

	// The input: unique orders, some published twice on the wire (fresh
	// Nats-Msg-Id each time, so JetStream does not drop them).
	const orders = 60
	publish := func(order string) {
		m := nats.NewMsg("in.orders")
		m.Header.Set(jetstream.MsgIDHeader, nuid.Next())
		m.Header.Set("Order-Id", order)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for i := range orders {
		o := fmt.Sprint("o", i)
		publish(o)
		if kindOf(o) == faultWireDup || i%7 == 0 {
			publish(o)
		}
	}

	// A runs, is stopped halfway (in-flight work rolls back and is
	// redelivered), and a new A process takes over.
	stopA := dbtest.Background(t, "A", newA().Run)
	dbtest.WaitFor(t, 20*time.Second, "A halfway", func() bool {
		return a.db.Count(t, `SELECT count(*) FROM effects`) >= orders/2
	})
	stopA()
	dbtest.Background(t, "A after the restart", newA().Run)

	dbtest.WaitFor(t, 40*time.Second, "B's effects for every order", func() bool {
		return b.db.Count(t, `SELECT count(DISTINCT order_id) FROM effects`) >= orders
	})
	// Let late redeliveries (dropped acks, relay re-sends) arrive; they
	// must change nothing.
	dbtest.WaitFor(t, 20*time.Second, "both consumers drained", func() bool {
		for _, c := range []struct{ stream, durable string }{{"IN", "svc-a"}, {"OUT", "svc-b"}} {
			ci, err := js.Consumer(ctx, c.stream, c.durable)
			if err != nil {
				return false
			}
			info, err := ci.Info(ctx)
			if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
				return false
			}
		}
		return a.db.Count(t, `SELECT count(*) FROM dedupe_outbox WHERE published_at IS NULL`) == 0
	})

	if n := a.db.Count(t, `SELECT count(*) FROM effects`); n != orders {
		t.Fatalf("A's effects = %d, want %d", n, orders)
	}
	if n := b.db.Count(t, `SELECT count(*) FROM effects`); n != orders {
		t.Fatalf("B's effects = %d, want %d (distinct %d)", n, orders, b.db.Count(t, `SELECT count(DISTINCT order_id) FROM effects`))
	}
	if n := b.db.Count(t, `SELECT count(DISTINCT order_id) FROM effects`); n != orders {
		t.Fatalf("B's distinct effects = %d", n)
	}
	if n := a.db.Count(t, `SELECT count(*) FROM dedupe_outbox`); n != orders {
		t.Fatalf("outbox rows = %d, want one per order", n)
	}
	out, _ := js.Stream(ctx, "OUT")
	info, err := out.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != orders {
		t.Fatalf("OUT stream holds %d, want %d (relay re-sends must be dropped by Nats-Msg-Id)", info.State.Msgs, orders)
	}
	if kills.Load() == 0 || pub.Duplicates() == 0 {
		t.Fatalf("relay crash never injected (kills %d, duplicates %d)", kills.Load(), pub.Duplicates())
	}
	// Every fault kind fired in both services.
	for _, step := range []string{"a", "b"} {
		for _, kind := range []string{"error", "panic", "kill", "drop"} {
			found := false
			f.fired.Range(func(k, _ any) bool {
				found = strings.HasPrefix(k.(string), step+"/"+kind+"/")
				return !found
			})
			if !found {
				t.Fatalf("fault %s/%s never fired", step, kind)
			}
		}
	}
	t.Logf("relay re-sends dropped by JetStream: %d", pub.Duplicates())
}

// crashAfterPublish publishes and then, while the relay still holds its
// transaction, kills the relay's database connections: the broker has the
// messages, the outbox does not know it.
type crashAfterPublish struct {
	pub   outbox.Publisher
	crash func()
}

func (c crashAfterPublish) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	errs := c.pub.Publish(ctx, msgs)
	c.crash()
	return errs
}
