package test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/internal/amqptest"
)

// TestDuplicatesAtOnceAcrossTwoRunners publishes every key five times at
// once while two runners (two connections, like two processes) consume the
// queue with eight workers each: every key has exactly one effect, every
// delivery is acked.
func TestDuplicatesAtOnceAcrossTwoRunners(t *testing.T) {
	b := setup(t, setupOpts{})
	cfg := fastConfig()
	cfg.Workers = 8
	var handled atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		handled.Add(1)
		time.Sleep(5 * time.Millisecond) // widen the window for a concurrent duplicate
		return insertEffect(ctx, tx, d)
	}
	r1 := newRunner(t, b, "", cfg, h)
	r2 := newRunner(t, b, "", cfg, h)
	stop1, stop2 := run(t, r1), run(t, r2)

	const keys, copies = 40, 5
	// Each copy from its own publisher goroutine, all released at once.
	var wg sync.WaitGroup
	start := make(chan struct{})
	for c := range copies {
		ch, err := b.conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer func() { _ = ch.Close() }()
			<-start
			for k := range keys {
				if err := publishConfirmed(ch, b.queue, amqp.Publishing{
					Headers: amqp.Table{orderIDHdr: fmt.Sprintf("order-%d", k)}, MessageId: fmt.Sprintf("m-%d-%d", k, c),
					Body: []byte("x"),
				}); err != nil {
					t.Errorf("publish: %v", err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	waitFor(t, 30*time.Second, "every key's effect", func() bool {
		return b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'complete'") == keys
	})
	b.settled(t)
	if err := errors.Join(stop1(), stop2()); err != nil {
		t.Fatalf("run: %v", err)
	}
	if n := amqptest.Count(t, b.conn, b.queue); n != 0 {
		t.Fatalf("%d messages left in the queue after both runners stopped, want 0 (all acked)", n)
	}
	if n := b.effects(t); n != keys {
		t.Fatalf("effects = %d, want %d (one per key)", n, keys)
	}
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != keys {
		t.Fatalf("distinct keys with effects = %d, want %d", n, keys)
	}
	if handled.Load() < keys {
		t.Fatalf("handler ran %d times, want at least %d", handled.Load(), keys)
	}
}

// TestFailTwiceThenSucceedRequeuedWithBackoff: a handler that fails twice
// is retried (held for the backoff, then requeued) and commits once.
func TestFailTwiceThenSucceedRequeuedWithBackoff(t *testing.T) {
	b := setup(t, setupOpts{})
	var calls atomic.Int64
	var delays []time.Duration
	var mu sync.Mutex
	cfg := fastConfig()
	cfg.Backoff = func(attempt int) time.Duration {
		mu.Lock()
		delays = append(delays, time.Duration(attempt)*30*time.Millisecond)
		mu.Unlock()
		return time.Duration(attempt) * 30 * time.Millisecond
	}
	r := newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if calls.Add(1) <= 2 {
			return errors.New("transient")
		}
		return insertEffect(ctx, tx, d)
	})
	stop := run(t, r)
	b.publish(t, "order-1", "x")
	waitFor(t, 20*time.Second, "the effect", func() bool { return b.effects(t) == 1 })
	b.settled(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", calls.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(delays) != "[30ms 60ms]" {
		t.Fatalf("backoff asked for %v, want [30ms 60ms] (attempts 1 and 2)", delays)
	}
	if n := b.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// TestPoisonRecordedThenDeadLetteredToQueueDLX: a handler returning
// dedupe.Permanent and one failing past MaxAttempts are recorded failed in
// the inbox and rejected to the queue's dead-letter exchange; the others
// flow.
func TestPoisonRecordedThenDeadLetteredToQueueDLX(t *testing.T) {
	b := setup(t, setupOpts{})
	cfg := fastConfig()
	cfg.MaxAttempts = 3
	var badCalls atomic.Int64
	r := newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		switch string(d.Body) {
		case "permanent":
			return dedupe.Permanent(errors.New("bad order"))
		case "flaky":
			badCalls.Add(1)
			return errors.New("always fails")
		}
		return insertEffect(ctx, tx, d)
	})
	stop := run(t, r)
	b.publish(t, "perm", "permanent")
	b.publish(t, "flaky", "flaky")
	for i := range 10 {
		b.publish(t, fmt.Sprintf("good-%d", i), "good")
	}
	waitFor(t, 20*time.Second, "both poison messages in the dead-letter queue", func() bool {
		return amqptest.Count(t, b.conn, b.dlq) == 2
	})
	waitFor(t, 20*time.Second, "10 effects", func() bool { return b.effects(t) == 10 })
	b.settled(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'failed' AND key IN ('perm', 'flaky')"); n != 2 {
		t.Fatalf("failed keys = %d, want 2 (recorded before dead-lettering)", n)
	}
	if n := badCalls.Load(); n != 3 {
		t.Fatalf("the flaky handler ran %d times, want MaxAttempts = 3", n)
	}
	got := map[string]bool{}
	for _, d := range amqptest.Drain(t, b.conn, b.dlq) {
		got[fmt.Sprint(d.Headers[orderIDHdr])] = true
		if d.Headers["x-first-death-reason"] != "rejected" {
			t.Errorf("dead-lettered with reason %v, want rejected", d.Headers["x-first-death-reason"])
		}
	}
	if !got["perm"] || !got["flaky"] {
		t.Fatalf("dead-letter queue holds %v, want perm and flaky", got)
	}
}

// TestPoisonCopiedToDeadLetterExchangeWithConfirms: with
// Config.DeadLetterExchange, the copy carries the Dedupe-* headers and the
// original's properties; an unroutable copy (no queue bound) is not taken
// for a success: the message stays unacked until a queue is bound.
func TestPoisonCopiedToDeadLetterExchangeWithConfirms(t *testing.T) {
	b := setup(t, setupOpts{noDLX: true})
	ex := amqptest.Name(t, "dlx")
	amqptest.Exchange(t, b.conn, ex, "direct")
	cfg := fastConfig()
	cfg.DeadLetterExchange = ex
	cfg.DeadLetterRoutingKey = "dead"
	obsEvents := &eventLog{}
	b.inbox = observedInbox(t, b, obsEvents)
	r := newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		return dedupe.Permanent(errors.New("bad order"))
	})
	stop := run(t, r)
	b.publishMsg(t, amqp.Publishing{Headers: amqp.Table{orderIDHdr: "o-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		MessageId: "mid-1", ContentType: "application/json", Body: []byte(`{"id":"o-1"}`)})
	// Unroutable first: nothing is bound to the exchange.
	waitFor(t, 20*time.Second, "a failed dead-letter publish", func() bool { return obsEvents.count(dedupe.EventDeadLetterFailed) > 0 })
	if n := obsEvents.count(dedupe.EventDeadLettered); n != 0 {
		t.Fatalf("%d dead_lettered events for an unroutable copy, want 0", n)
	}
	if err := obsEvents.firstErr(dedupe.EventDeadLetterFailed); !errors.Is(err, dedupeamqp.ErrUnroutable) {
		t.Fatalf("dead-letter failure %v, want ErrUnroutable", err)
	}
	amqptest.Queue(t, b.conn, b.dlq, nil)
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.QueueBind(b.dlq, "dead", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the copy", func() bool { return amqptest.Count(t, b.conn, b.dlq) == 1 })
	b.settled(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	d := amqptest.Drain(t, b.conn, b.dlq)[0]
	for k, want := range map[string]any{
		dedupeamqp.DeadLetterQueueHeader: b.queue, dedupeamqp.DeadLetterKeyHeader: "o-1", orderIDHdr: "o-1",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	} {
		if d.Headers[k] != want {
			t.Errorf("copy header %s = %v, want %v", k, d.Headers[k], want)
		}
	}
	if d.MessageId != "mid-1" || d.ContentType != "application/json" || string(d.Body) != `{"id":"o-1"}` {
		t.Errorf("copy = %q %q %q, want the original's message_id, content type and body", d.MessageId, d.ContentType, d.Body)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'o-1' AND state = 'failed'"); n != 1 {
		t.Fatalf("o-1 not recorded failed")
	}
}

// TestKeylessAndConflictRecordedAndDeadLettered: a message without the key
// header, and one reusing a key with another payload, are recorded failed
// under RefusedKey and rejected to the queue's dead-letter exchange, never
// only logged.
func TestKeylessAndConflictRecordedAndDeadLettered(t *testing.T) {
	b := setup(t, setupOpts{})
	cfg := fastConfig()
	cfg.Fingerprint = func(d amqp.Delivery) []byte { return d.Body }
	r := newRunner(t, b, "", cfg, nil)
	stop := run(t, r)
	b.publish(t, "o-1", "first")
	waitFor(t, 20*time.Second, "o-1's effect", func() bool { return b.effects(t) == 1 })
	b.publish(t, "o-1", "second payload")
	b.publish(t, "", "no key")
	waitFor(t, 20*time.Second, "two dead-lettered", func() bool { return amqptest.Count(t, b.conn, b.dlq) == 2 })
	b.settled(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key LIKE $1 AND state = 'failed'", dedupeamqp.RefusedKeyPrefix+"%"); n != 2 {
		t.Fatalf("refused records = %d, want 2", n)
	}
	if n := b.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// TestShutdownDrainsInFlightAndHandsBackTheRest: a stop lets the running
// handler commit within DrainTimeout (acked), hands back what was not
// started without acking it, and a handler cancelled past DrainTimeout is
// rolled back and handed back.
func TestShutdownDrainsInFlightAndHandsBackTheRest(t *testing.T) {
	b := setup(t, setupOpts{})
	cfg := fastConfig()
	cfg.Workers = 1
	cfg.Prefetch = 10
	cfg.DrainTimeout = 5 * time.Second
	started := make(chan struct{}, 10)
	release := make(chan struct{})
	r := newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		started <- struct{}{}
		<-release
		return insertEffect(ctx, tx, d)
	})
	for i := range 5 {
		b.publish(t, fmt.Sprintf("o-%d", i), "x")
	}
	stop := run(t, r)
	<-started
	waitFor(t, 20*time.Second, "all five delivered to the runner", func() bool { return amqptest.Count(t, b.conn, b.queue) == 0 })
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The stop is under way (paced by progress, not a sleep): the four
	// deliveries not started are back in the queue while the handler still
	// runs. A sleep here let the worker, on a loaded machine, start a
	// second delivery before the stop was seen.
	waitFor(t, 20*time.Second, "the four not started handed back", func() bool { return amqptest.Count(t, b.conn, b.queue) == 4 })
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1 (the in-flight one committed, nothing else started)", n)
	}
	if n := amqptest.Count(t, b.conn, b.queue); n != 4 {
		t.Fatalf("%d messages back in the queue, want 4", n)
	}

	// Past DrainTimeout: cancelled, rolled back, handed back.
	cfg.DrainTimeout = 50 * time.Millisecond
	r2 := newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if err := insertEffect(ctx, tx, d); err != nil {
			return err
		}
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	stop2 := run(t, r2)
	<-started
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1 (the cancelled handler rolled back)", n)
	}
	if n := amqptest.Count(t, b.conn, b.queue); n != 4 {
		t.Fatalf("%d messages back in the queue, want 4", n)
	}
}

// TestQueueDeletedRunReturnsErrQueueGone: the broker cancels the consumer
// when its queue is deleted; Run ends with ErrQueueGone rather than spin.
func TestQueueDeletedRunReturnsErrQueueGone(t *testing.T) {
	b := setup(t, setupOpts{})
	r := newRunner(t, b, "", fastConfig(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	b.publish(t, "o-1", "x")
	waitFor(t, 20*time.Second, "the effect", func() bool { return b.effects(t) == 1 })
	if _, err := b.ch.QueueDelete(b.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, dedupeamqp.ErrQueueGone) {
			t.Fatalf("Run = %v, want ErrQueueGone", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its queue was deleted")
	}
}

// TestNewValidatesConfig: settings that would break the guarantee are
// refused.
func TestNewValidatesConfig(t *testing.T) {
	b := setup(t, setupOpts{})
	h := func(context.Context, pgx.Tx, amqp.Delivery) error { return nil }
	for name, c := range map[string]struct {
		cfg   dedupeamqp.Config
		url   string
		field string
	}{
		"recovery":     {cfg: dedupeamqp.Config{AMQP: amqp.Config{Recovery: &amqp.Recovery{}}}, field: "AMQP.Recovery"},
		"attempts":     {cfg: dedupeamqp.Config{DeliveryLimit: 3, MaxAttempts: 5}, field: "MaxAttempts"},
		"prefetch":     {cfg: dedupeamqp.Config{Workers: 8, Prefetch: 4}, field: "Prefetch"},
		"url":          {cfg: dedupeamqp.Config{}, url: "http://x", field: "url"},
		"negativeLim":  {cfg: dedupeamqp.Config{DeliveryLimit: -1}, field: "DeliveryLimit"},
		"unlimitedAtt": {cfg: dedupeamqp.Config{DeliveryLimit: 3, MaxAttempts: -1}, field: "MaxAttempts"},
	} {
		url := c.url
		if url == "" {
			url = amqptest.URL()
		}
		_, err := dedupeamqp.New(b.inbox, url, b.queue, c.cfg, h)
		var ce *dedupe.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: New = %v, want a ConfigError on %s", name, err, c.field)
		}
	}
	r, err := dedupeamqp.New(b.inbox, amqptest.URL(), b.queue, dedupeamqp.Config{DeliveryLimit: 4}, h)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Config().MaxAttempts; got != 5 {
		t.Fatalf("MaxAttempts with DeliveryLimit 4 = %d, want 5 (capped at the deliveries the queue allows)", got)
	}
	if r.Scope() != b.queue {
		t.Fatalf("Scope = %q, want the queue name", r.Scope())
	}
}

// eventLog is an Observer recording transport events.
type eventLog struct {
	dedupe.NopObserver
	mu     sync.Mutex
	events []dedupe.TransportEvent
}

func (l *eventLog) TransportEvent(_ context.Context, e dedupe.TransportEvent) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) count(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.Name == name {
			n++
		}
	}
	return n
}

func (l *eventLog) firstErr(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.Name == name {
			return e.Err
		}
	}
	return nil
}

// observedInbox is an inbox over b's schema whose Observer is obs.
func observedInbox(t *testing.T, b *bundle, obs dedupe.Observer) *dedupe.Inbox {
	t.Helper()
	inbox, err := dedupe.New(b.db.Pool, dedupe.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return inbox
}
