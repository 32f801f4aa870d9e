package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// The tests of this file push JetStream's limits (MaxDeliver, AckWait, the
// pull buffer): every message must end in one visible state, its effect
// committed once, its key failed in the inbox, or a copy in the dead-letter
// stream.

// deadLetters creates the dead-letter stream DLQ on dlq.> and returns a
// function that reads the copies in it.
func (b *bundle) deadLetters(t *testing.T) func() []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.>"}})
	if err != nil {
		t.Fatalf("create DLQ: %v", err)
	}
	return func() []*jetstream.RawStreamMsg {
		si, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []*jetstream.RawStreamMsg
		for seq := si.State.FirstSeq; seq > 0 && seq <= si.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
}

// A 2 s database outage with MaxDeliver 5 used to lose every message: each
// failed claim was naked, every nak spent a delivery, and JetStream stopped
// delivering with no effect and no inbox row. The runner now holds a message
// whose database is unreachable (InProgress) and retries; the buffered ones
// are kept alive too, so no delivery is spent.
func TestDatabaseOutageSpendsNoDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := observetest.New()
	inbox, proxy := b.inboxBehind(t, c)
	cons := b.consumer(t, jetstream.ConsumerConfig{Durable: "capped", MaxDeliver: 5, AckWait: time.Second})
	cfg := fastConfig()
	cfg.Heartbeat = 100 * time.Millisecond // a tenth of AckWait
	r, err := dedupenats.New(inbox, cons, *cfg, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	const total = 10
	proxy.Down()
	dbtest.Background(t, "runner", r.Run)
	for n := range total {
		b.publish(t, fmt.Sprintf("order-%d", n), "x")
	}
	// The outage lasts 250 failed tries (20 ms apart, 4 workers: longer
	// than AckWait), or until JetStream has nothing left to deliver.
	dbtest.WaitFor(t, 60*time.Second, "250 failed database tries, or every delivery spent", func() bool {
		return c.Events(dedupe.EventRetried) >= 250 || unackedOf(t, cons) == 0
	})
	proxy.Up()
	c.Wait(t, 30*time.Second, "nothing left to deliver or to acknowledge", func() bool {
		return unackedOf(t, cons) == 0
	})
	if n := b.effects(t); n != total {
		t.Fatalf("effects = %d, want %d: %d messages lost to MaxDeliver during the outage", n, total, total-n)
	}
	ci := info(t, cons)
	if ci.NumRedelivered != 0 {
		t.Fatalf("redelivered = %d, want 0: the outage must not spend deliveries", ci.NumRedelivered)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'complete'"); n != total {
		t.Fatalf("complete keys = %d, want %d", n, total)
	}
	if processed(c) != total || c.Events(dedupe.EventTerminated) != 0 {
		t.Fatalf("observed %s; want %d processed, none terminated", c, total)
	}
}

// Deliveries spent without an attempt (naks of stopped runners) used to let
// a message reach its last delivery with attempts left in the inbox: its
// failure there was naked, and JetStream dropped it with the key in flight.
func TestHandlerFailureAtLastDeliveryRecordedAsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	cons := b.consumer(t, jetstream.ConsumerConfig{Durable: "capped", MaxDeliver: 3, AckWait: 30 * time.Second})
	b.publish(t, "doomed", "x")
	spendDeliveries(t, cons, 2)

	var (
		c    = observetest.New()
		runs atomic.Int64
	)
	r := newRunner(t, b.observed(t, c), cons, fastConfig(), func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		runs.Add(1)
		return errors.New("downstream refused")
	})
	dbtest.Background(t, "runner", r.Run)
	c.Wait(t, 10*time.Second, "the third delivery handled", func() bool {
		return c.Events(dedupe.EventRetried)+c.Events(dedupe.EventTerminated) >= 1 && unackedOf(t, cons) == 0
	})
	if n := b.db.Count(t, `SELECT count(*) FROM dedupe_inbox WHERE key = 'doomed' AND state = 'failed'
		AND attempts = 1 AND last_error LIKE '%downstream refused%'`); n != 1 {
		t.Fatalf("the key is not recorded as failed after its last delivery (inbox: %v)", inboxRows(t, b))
	}
	if c.Events(dedupe.EventTerminated) != 1 || c.Events(dedupe.EventRetried) != 0 || runs.Load() != 1 {
		t.Fatalf("observed %s, runs = %d; want 1 terminated, no retry, 1 run", c, runs.Load())
	}
}

// A runner stopped during a database outage used to nak the message it
// held; at its last delivery that nak let it lapse. It is now copied to the
// dead-letter subject and only then terminated.
func TestStopAtLastDeliveryDuringOutageDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	dlq := b.deadLetters(t)
	c := observetest.New()
	inbox, proxy := b.inboxBehind(t, c)
	cons := b.consumer(t, jetstream.ConsumerConfig{Durable: "capped", MaxDeliver: 2, AckWait: 30 * time.Second})
	b.publish(t, "order-1", "ship")
	spendDeliveries(t, cons, 1)

	cfg := fastConfig()
	cfg.DrainTimeout = 100 * time.Millisecond
	cfg.DeadLetterSubject, cfg.DeadLetterJS = "dlq.orders", b.js
	r, err := dedupenats.New(inbox, cons, *cfg, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Down()
	stop := dbtest.Background(t, "runner", r.Run)
	dbtest.WaitFor(t, 10*time.Second, "five failed database tries, or the message gone", func() bool {
		return c.Events(dedupe.EventRetried) >= 5 || unackedOf(t, cons) == 0
	})
	stop()

	copies := dlq()
	if len(copies) != 1 {
		t.Fatalf("dead-letter copies = %d, want 1 (the message lapsed at its last delivery)", len(copies))
	}
	m := copies[0]
	for hdr, want := range map[string]string{
		dedupenats.DeadLetterKeyHeader:        "order-1",
		dedupenats.DeadLetterSubjectHeader:    "orders.created",
		dedupenats.DeadLetterStreamHeader:     streamName,
		dedupenats.DeadLetterSequenceHeader:   "1",
		dedupenats.DeadLetterConsumerHeader:   "capped",
		dedupenats.DeadLetterDeliveriesHeader: "2",
		orderIDHdr:                            "order-1",
	} {
		if got := m.Header.Get(hdr); got != want {
			t.Errorf("header %s = %q, want %q", hdr, got, want)
		}
	}
	if reason := m.Header.Get(dedupenats.DeadLetterReasonHeader); !strings.Contains(reason, "last delivery") {
		t.Errorf("reason = %q, want it to name the last delivery", reason)
	}
	if string(m.Data) != "ship" {
		t.Errorf("data = %q, want the original", m.Data)
	}
	if c.Events(dedupe.EventTerminated) != 1 || c.Events(dedupe.EventDeadLettered) != 1 {
		t.Fatalf("observed %s; want 1 dead-lettered and terminated", c)
	}
	// The Term is not confirmed by the server: wait until it was processed.
	dbtest.WaitFor(t, 10*time.Second, "the terminated message gone from the consumer", func() bool {
		return unackedOf(t, cons) == 0
	})
}

// Without a dead-letter subject, a runner stopped during an outage with a
// message at its last delivery does not return until the database records
// the key as failed; meanwhile the message is kept alive.
func TestStopAtLastDeliveryWithoutDeadLetterWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := observetest.New()
	inbox, proxy := b.inboxBehind(t, c)
	cons := b.consumer(t, jetstream.ConsumerConfig{Durable: "capped", MaxDeliver: 2, AckWait: time.Second})
	b.publish(t, "order-1", "ship")
	spendDeliveries(t, cons, 1)

	cfg := fastConfig()
	cfg.DrainTimeout = 100 * time.Millisecond
	cfg.Heartbeat = 100 * time.Millisecond
	cfg.Logger = testLogger(t)
	r, err := dedupenats.New(inbox, cons, *cfg, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Down()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	dbtest.WaitFor(t, 10*time.Second, "five failed database tries, or the message gone", func() bool {
		return c.Events(dedupe.EventRetried) >= 5 || unackedOf(t, cons) == 0
	})
	cancel()
	// 100 refused connections, 20 ms apart: two AckWaits at least.
	from := proxy.refused.Load()
	returned := false
	dbtest.WaitFor(t, 30*time.Second, "100 more refused connections, or Run to return", func() bool {
		select {
		case <-done:
			returned = true
			return true
		default:
			return proxy.refused.Load()-from >= 100
		}
	})
	if returned {
		t.Fatalf("Run returned while the database was down, with the message at its last delivery neither recorded nor dead-lettered (inbox: %v)",
			inboxRows(t, b))
	}
	proxy.Up()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the database came back")
	}
	if n := b.db.Count(t, `SELECT count(*) FROM dedupe_inbox WHERE key = 'order-1' AND state = 'failed'
		AND last_error LIKE '%last delivery%'`); n != 1 {
		t.Fatalf("the key is not recorded as failed (inbox: %v)", inboxRows(t, b))
	}
	if c.Events(dedupe.EventTerminated) != 1 || b.effects(t) != 0 {
		t.Fatalf("terminated = %d, effects = %d; want 1, 0", c.Events(dedupe.EventTerminated), b.effects(t))
	}
	// The Term is not confirmed by the server (no reply to wait for): the
	// consumer shows the message gone once the server processed it.
	dbtest.WaitFor(t, 10*time.Second, "the terminated message gone from the consumer", func() bool {
		return unackedOf(t, cons) == 0
	})
}

// A handler cancelled by a shutdown at the message's last delivery: the
// message used to be naked and lapse; its key is now recorded as failed.
func TestStopAtLastDeliveryRecordsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	cons := b.consumer(t, jetstream.ConsumerConfig{Durable: "capped", MaxDeliver: 2, AckWait: 30 * time.Second})
	b.publish(t, "order-1", "ship")
	b.publish(t, "order-2", "ship")
	spendDeliveries(t, cons, 1) // order-1 is at its last delivery, order-2 at its first

	c := observetest.New()
	cfg := fastConfig()
	cfg.Workers = 2
	cfg.DrainTimeout = 100 * time.Millisecond
	started := make(chan struct{}, 2)
	r := newRunner(t, b.observed(t, c), cons, cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		started <- struct{}{}
		<-ctx.Done() // stuck until the drain timeout cancels it
		return ctx.Err()
	})
	stop := dbtest.Background(t, "runner", r.Run)
	for range 2 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("handlers did not start")
		}
	}
	stop()
	if n := b.db.Count(t, `SELECT count(*) FROM dedupe_inbox WHERE key = 'order-1' AND state = 'failed'
		AND last_error LIKE '%runner stopped%'`); n != 1 {
		t.Fatalf("order-1 is not recorded as failed at its last delivery (inbox: %v)", inboxRows(t, b))
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'order-2'"); n != 0 {
		t.Fatal("order-2 was recorded; a shutdown before the last delivery is not an attempt")
	}
	if c.Events(dedupe.EventTerminated) != 1 || c.Events(dedupe.EventReleased) != 1 || b.effects(t) != 0 {
		t.Fatalf("observed %s, effects = %d; want 1 terminated, 1 released, no effect", c, b.effects(t))
	}
	// The Term of order-1 gets no reply: the consumer shows it gone once
	// the server processed it, and order-2 handed back.
	dbtest.WaitFor(t, 10*time.Second, "order-1 gone from the consumer, order-2 handed back", func() bool {
		return unackedOf(t, cons) == 1
	})
}

// A message without a usable key cannot be recorded in the inbox; with a
// dead-letter subject it is copied there before it is terminated.
func TestKeylessMessageDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	dlq := b.deadLetters(t)
	c := observetest.New()
	cfg := fastConfig()
	cfg.DeadLetterSubject, cfg.DeadLetterJS = "dlq.orders", b.js
	dbtest.Background(t, "runner", newRunner(t, b.observed(t, c), b.cons, cfg, nil).Run)
	m := nats.NewMsg("orders.created")
	m.Header.Set("Trace", "t-1")
	m.Header.Set(jetstream.MsgIDHeader, "msg-1")
	m.Data = []byte("no order id")
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	c.Wait(t, 10*time.Second, "the message terminated", func() bool {
		return c.Events(dedupe.EventTerminated) == 1 && b.unacked(t) == 0
	})
	if c.Events(dedupe.EventRefused) != 1 || c.Events(dedupe.EventDeadLettered) != 1 || c.Started("") != 0 {
		t.Fatalf("observed %s; want the message refused and dead-lettered, never handled", c)
	}
	copies := dlq()
	if len(copies) != 1 {
		t.Fatalf("dead-letter copies = %d, want 1", len(copies))
	}
	h := copies[0].Header
	if h.Get("Trace") != "t-1" || h.Get(dedupenats.DeadLetterMsgIDHeader) != "msg-1" ||
		!strings.Contains(h.Get(dedupenats.DeadLetterReasonHeader), "no usable key") {
		t.Fatalf("dead-letter headers = %v", h)
	}
}

// Messages buffered behind a slow handler used to wait without InProgress;
// their AckWait expired in the buffer and they were delivered a second time
// while the first copy was still queued. The heartbeat now keeps buffered
// messages alive as well, and the default buffer is large.
func TestBufferedMessagesOutliveAckWaitBehindSlowHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{ackWait: time.Second})
	// Count the InProgress marks each message gets.
	var (
		mu    sync.Mutex
		marks = map[string]int{}
	)
	sub, err := b.nc.Subscribe("$JS.ACK."+streamName+"."+durable+".>", func(m *nats.Msg) {
		if string(m.Data) == "+WPI" {
			mu.Lock()
			marks[m.Subject]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	c := observetest.New()
	cfg := fastConfig()
	cfg.Workers = 1
	cfg.Heartbeat = 100 * time.Millisecond // a tenth of AckWait
	var runs atomic.Int64
	r := newRunner(t, b.observed(t, c), b.cons, cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if runs.Add(1) == 1 {
			// The first handler is slow: the others wait in the buffer for
			// two and a half AckWaits.
			select {
			case <-time.After(2500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return insertEffect(ctx, tx, msg)
	})
	const total = 8
	for n := range total {
		b.publish(t, fmt.Sprintf("order-%d", n), "x")
	}
	dbtest.Background(t, "runner", r.Run)
	c.Wait(t, 20*time.Second, "every message acked", func() bool {
		return processed(c)+duplicates(c) >= total && b.unacked(t) == 0
	})
	ci := info(t, b.cons)
	if ci.NumRedelivered != 0 || duplicates(c) != 0 || runs.Load() != total {
		t.Fatalf("redelivered = %d, duplicates = %d, handler runs = %d; want 0, 0, %d (buffered messages expired)",
			ci.NumRedelivered, duplicates(c), runs.Load(), total)
	}
	if n := b.effects(t); n != total {
		t.Fatalf("effects = %d, want %d", n, total)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(marks) != total {
		t.Fatalf("messages marked in progress = %d, want %d (the slow one and every buffered one)", len(marks), total)
	}
}

// One worker used to send a pull request per message (MaxPending defaulted
// to Workers); the default buffer now serves many messages per request.
func TestOneWorkerPullsManyMessagesPerRequest(t *testing.T) {
	t.Parallel()
	for _, mode := range []dedupenats.AckMode{dedupenats.AckDouble, dedupenats.AckSingle} {
		name := map[dedupenats.AckMode]string{dedupenats.AckDouble: "DoubleAck", dedupenats.AckSingle: "Ack"}[mode]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{ackWait: 30 * time.Second})
			const total = 300
			for n := range total {
				m := nats.NewMsg("orders.created")
				m.Header.Set(orderIDHdr, fmt.Sprintf("order-%d", n))
				if _, err := b.js.PublishMsgAsync(m); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-b.js.PublishAsyncComplete():
			case <-time.After(20 * time.Second):
				t.Fatal("publishes not acknowledged")
			}
			nc, cons := b.conn(t) // the runner's own connection, to count what it sends
			c := observetest.New()
			cfg := fastConfig()
			cfg.Workers, cfg.AckMode = 1, mode
			r := newRunner(t, b.observed(t, c), cons, cfg, nil)
			before := nc.Stats().OutMsgs
			stop := dbtest.Background(t, "runner", r.Run)
			// A message is counted when its handling ends, before its ack;
			// the acks are asked of the test's own connection, so as not to
			// count the question.
			c.Wait(t, 60*time.Second, "every message processed and acked", func() bool {
				return processed(c) == total && b.unacked(t) == 0
			})
			sent := nc.Stats().OutMsgs - before
			stop()
			perMsg := float64(sent) / total
			t.Logf("%s: %d outgoing NATS messages for %d messages: %.3f per message", name, sent, total, perMsg)
			// One ack per message, and pull requests for many at a time.
			if perMsg > 1.1 {
				t.Fatalf("%.3f outgoing NATS messages per message, want at most 1.1 (one ack, and a pull request per many)", perMsg)
			}
			if n := b.effects(t); n != total {
				t.Fatalf("effects = %d, want %d", n, total)
			}
		})
	}
}

// inboxRows lists the inbox for a failure message.
func inboxRows(t *testing.T, b *bundle) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(),
		"SELECT key || ' ' || state || ' attempts=' || attempts || ' ' || coalesce(last_error, '') FROM dedupe_inbox ORDER BY key")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
