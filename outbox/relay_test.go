package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/outbox"
)

// runRelay runs r until the test ends (or stop is called) and fails the test
// if Run returns an error.
func runRelay(t *testing.T, r *outbox.Relay) (stop func()) {
	t.Helper()
	return dbtest.Background(t, "relay", r.Run)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	dbtest.WaitFor(t, d, what, cond)
}

// TestRelayTwoRelaysOrderedExactlyOnce runs two relays while writers commit
// messages for a few keys concurrently: every message is published once, a
// key never has two messages in flight, and each key arrives in commit order.
func TestRelayTwoRelaysOrderedExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	b.outbox, _ = outbox.New(b.db.Pool, outbox.Config{}) // real clock: Run polls in real time
	rec := newRecorder()
	rec.delay = time.Millisecond
	cfg := outbox.RelayConfig{BatchSize: 7, PollInterval: 20 * time.Millisecond}
	runRelay(t, b.relay(t, rec, cfg))
	runRelay(t, b.relay(t, rec, cfg))

	const writers, perWriter, keys = 6, 25, 4
	var seq [keys]atomic.Int64
	b.db.Exec(t, `CREATE TABLE seq (key text PRIMARY KEY, n int NOT NULL)`)
	for k := range keys {
		b.db.Exec(t, `INSERT INTO seq VALUES ($1, 0)`, fmt.Sprint("k", k))
	}
	errs := make([]error, writers)
	together(writers, func(w int) {
		for i := range perWriter {
			k := (w + i) % keys
			key := fmt.Sprint("k", k)
			err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				// Enqueue, then take the place in the key's commit order.
				id, err := b.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: key})
				if err != nil {
					return err
				}
				var n int
				if err := tx.QueryRow(ctx, `UPDATE seq SET n = n + 1 WHERE key = $1 RETURNING n`, key).Scan(&n); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `UPDATE dedupe_outbox SET payload = $2 WHERE message_id = $1`, id, []byte(strconv.Itoa(n)))
				return err
			})
			if err != nil {
				errs[w] = err
				return
			}
			seq[k].Add(1)
			if i%3 == 0 {
				// A few unkeyed messages in between.
				b.enqueue(t, outbox.Message{Topic: "t", Payload: []byte("-")})
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	unkeyed := writers * ((perWriter + 2) / 3)
	total := writers*perWriter + unkeyed
	waitFor(t, 20*time.Second, "all messages published", func() bool {
		got, _, _ := rec.snapshot()
		return len(got) >= total
	})
	time.Sleep(100 * time.Millisecond) // let a wrong extra send show up
	got, sends, violations := rec.snapshot()
	if len(violations) > 0 {
		t.Fatalf("violations: %v", violations[:min(len(violations), 5)])
	}
	if len(got) != total || len(sends) != total {
		t.Fatalf("published %d (%d distinct), want %d", len(got), len(sends), total)
	}
	for id, n := range sends {
		if n != 1 {
			t.Fatalf("message %s published %d times", id, n)
		}
	}
	last := map[string]int{}
	for _, m := range got {
		if m.Key == "" {
			continue
		}
		n, _ := strconv.Atoi(string(m.Payload))
		if n != last[m.Key]+1 {
			t.Fatalf("key %s: commit position %d published after %d", m.Key, n, last[m.Key])
		}
		last[m.Key] = n
	}
	for k := range keys {
		if int64(last[fmt.Sprint("k", k)]) != seq[k].Load() {
			t.Fatalf("key k%d: last %d of %d", k, last[fmt.Sprint("k", k)], seq[k].Load())
		}
	}
}

// TestRelayRetriesThenParksAndHoldsTheKey: a message that keeps failing is
// retried with backoff, parked with its error after MaxAttempts, holds back
// its key's later messages (order), while other keys flow; unparked, it and
// the held messages go out in order.
func TestRelayRetriesThenParksAndHoldsTheKey(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	rec := newRecorder()
	poison := errors.New("schema registry says no")
	rec.setFail(func(m *outbox.StoredMessage) error {
		if string(m.Payload) == "bad" {
			return poison
		}
		return nil
	})
	var failed, parkedHook atomic.Int32
	relay := b.relay(t, rec, outbox.RelayConfig{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: 4 * time.Second,
		Observer: relayHooks{Failed: func(_ *outbox.StoredMessage, err error, parked bool) {
			failed.Add(1)
			if parked {
				parkedHook.Add(1)
			}
		}}})
	ids := b.enqueue(t,
		outbox.Message{Topic: "t", Key: "a", Payload: []byte("bad")},
		outbox.Message{Topic: "t", Key: "a", Payload: []byte("a2")},
		outbox.Message{Topic: "t", Key: "b", Payload: []byte("b1")})
	if n := cycle(t, relay); n != 1 {
		t.Fatalf("cycle 1 published %d, want only b1", n)
	}
	// Not due yet: nothing happens.
	if n := cycle(t, relay); n != 0 || failed.Load() != 1 {
		t.Fatalf("before backoff: published %d, failures %d", n, failed.Load())
	}
	for attempt := 2; attempt <= 3; attempt++ {
		b.clock.Advance(5 * time.Second)
		b.enqueue(t, outbox.Message{Topic: "t", Key: "b", Payload: []byte(fmt.Sprint("b", attempt))})
		if n := cycle(t, relay); n != 1 {
			t.Fatalf("attempt %d: published %d, want the new b", attempt, n)
		}
	}
	if failed.Load() != 3 || parkedHook.Load() != 1 {
		t.Fatalf("failures %d, parked %d", failed.Load(), parkedHook.Load())
	}
	b.clock.Advance(time.Hour)
	if n := cycle(t, relay); n != 0 {
		t.Fatalf("parked key published %d", n)
	}
	parked, err := b.outbox.Parked(ctx, 10)
	if err != nil || len(parked) != 1 || parked[0].ID != ids[0] || parked[0].Attempt != 3 ||
		parked[0].LastError != poison.Error() || parked[0].ParkedAt.IsZero() {
		t.Fatalf("parked = %+v, %v", parked, err)
	}
	st, err := b.outbox.Stats(ctx)
	if err != nil || st.Pending != 1 || st.Parked != 1 {
		t.Fatalf("stats = %+v, %v", st, err)
	}

	// The operator fixes the cause and unparks it.
	rec.setFail(nil)
	if err := b.outbox.Unpark(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := b.outbox.Unpark(ctx, ids[0]); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("second unpark: %v", err)
	}
	if n := cycle(t, relay); n != 2 {
		t.Fatalf("after unpark published %d, want 2", n)
	}
	got, _, _ := rec.snapshot()
	var order []string
	for _, m := range got {
		if m.Key == "a" {
			order = append(order, string(m.Payload))
		}
	}
	if fmt.Sprint(order) != "[bad a2]" {
		t.Fatalf("key a order = %v", order)
	}
}

// TestRelayPermanentErrorParksAtOnce: Permanent skips the retries.
func TestRelayPermanentErrorParksAtOnce(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	rec := newRecorder()
	rec.setFail(func(*outbox.StoredMessage) error { return dedupe.Permanent(errors.New("no such topic")) })
	relay := b.relay(t, rec, outbox.RelayConfig{})
	b.enqueue(t, outbox.Message{Topic: "nowhere"})
	if n := cycle(t, relay); n != 0 {
		t.Fatal(n)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL AND attempts = 1"); n != 1 {
		t.Fatalf("parked = %d", n)
	}
}

// TestRelayBrokerDownMessagesWait: while every publish fails the relay counts
// no attempts (nothing gets parked however long it lasts) and backs off; when
// the broker is back all messages arrive once.
func TestRelayBrokerDownMessagesWait(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	b.outbox, _ = outbox.New(b.db.Pool, outbox.Config{})
	rec := newRecorder()
	var down atomic.Bool
	down.Store(true)
	var tries atomic.Int32
	rec.setFail(func(*outbox.StoredMessage) error {
		tries.Add(1)
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	})
	relay := b.relay(t, rec, outbox.RelayConfig{MaxAttempts: 2, MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	if _, err := relay.Cycle(context.Background()); err != nil {
		t.Fatal(err)
	}
	const n = 30
	for i := range n {
		b.enqueue(t, outbox.Message{Topic: "t", Key: fmt.Sprint("k", i%3)})
	}
	_, err := relay.Cycle(context.Background())
	var pe *outbox.PublishError
	if !errors.Is(err, outbox.ErrPublishFailed) || !errors.As(err, &pe) || pe.Failed != 3 {
		t.Fatalf("cycle while down: %v", err)
	}
	runRelay(t, relay)
	waitFor(t, 5*time.Second, "several failed cycles", func() bool { return tries.Load() > 20 })
	if c := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE attempts > 0 OR parked_at IS NOT NULL"); c != 0 {
		t.Fatalf("outage counted attempts on %d rows", c)
	}
	down.Store(false)
	waitFor(t, 10*time.Second, "all messages after the outage", func() bool {
		got, _, _ := rec.snapshot()
		return len(got) >= n
	})
	_, sends, violations := rec.snapshot()
	if len(sends) != n || len(violations) > 0 {
		t.Fatalf("distinct sends %d, violations %v", len(sends), violations)
	}
}

// TestRelayListenNotifyWakesAndSurvivesKilledConnection: with a poll interval
// of a minute, only NOTIFY can deliver within seconds, also after the LISTEN
// connection was killed.
func TestRelayListenNotifyWakesAndSurvivesKilledConnection(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	b.outbox, _ = outbox.New(b.db.Pool, outbox.Config{})
	rec := newRecorder()
	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cc := pcfg.ConnConfig
	cc.RuntimeParams["application_name"] = "relay-listen-" + b.db.Schema
	relay := b.relay(t, rec, outbox.RelayConfig{PollInterval: time.Minute, MinBackoff: 20 * time.Millisecond,
		ListenConn: func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cc.Copy()) }})
	runRelay(t, relay)
	waitFor(t, 5*time.Second, "LISTEN connection", func() bool {
		return len(b.db.BackendPIDs(t, cc.RuntimeParams["application_name"])) == 1
	})
	published := func(n int) func() bool {
		return func() bool { got, _, _ := rec.snapshot(); return len(got) >= n }
	}
	b.enqueue(t, outbox.Message{Topic: "t", Payload: []byte("1")})
	waitFor(t, 5*time.Second, "notified publish", published(1))

	for _, pid := range b.db.BackendPIDs(t, cc.RuntimeParams["application_name"]) {
		b.db.Terminate(t, pid)
	}
	time.Sleep(50 * time.Millisecond)
	waitFor(t, 5*time.Second, "LISTEN reconnect", func() bool {
		return len(b.db.BackendPIDs(t, cc.RuntimeParams["application_name"])) == 1
	})
	b.enqueue(t, outbox.Message{Topic: "t", Payload: []byte("2")})
	waitFor(t, 5*time.Second, "notified publish after reconnect", published(2))
}

// TestRelayPollingFallbackAndHooks: without LISTEN the poll still delivers,
// and the metrics hooks see the queue, the publishes with their lag, and the
// failures.
func TestRelayPollingFallbackAndHooks(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	b.outbox, _ = outbox.New(b.db.Pool, outbox.Config{})
	rec := newRecorder()
	rec.setFail(func(m *outbox.StoredMessage) error {
		if string(m.Payload) == "fail" {
			return errors.New("refused")
		}
		return nil
	})
	var (
		mu       sync.Mutex
		queued   []outbox.Stats
		lags     []time.Duration
		failures int
	)
	hooks := relayHooks{
		Queued:    func(s outbox.Stats) { mu.Lock(); queued = append(queued, s); mu.Unlock() },
		Published: func(_ *outbox.StoredMessage, lag time.Duration) { mu.Lock(); lags = append(lags, lag); mu.Unlock() },
		Failed:    func(*outbox.StoredMessage, error, bool) { mu.Lock(); failures++; mu.Unlock() },
	}
	b.enqueue(t, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t", Payload: []byte("fail")})
	runRelay(t, b.relay(t, rec, outbox.RelayConfig{DisableListen: true, PollInterval: 30 * time.Millisecond,
		StatsInterval: 10 * time.Millisecond, MinBackoff: time.Hour, MaxBackoff: time.Hour, Observer: hooks}))
	waitFor(t, 5*time.Second, "polled publish and stats", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lags) == 2 && failures == 1 && len(queued) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if first := queued[0]; first.Pending != 3 || first.OldestPending <= 0 {
		t.Fatalf("first stats = %+v", first)
	}
	if last := queued[len(queued)-1]; last.Pending != 1 || last.Parked != 0 {
		t.Fatalf("last stats = %+v", last)
	}
	for _, l := range lags {
		if l <= 0 || l > 5*time.Second {
			t.Fatalf("lag = %v", l)
		}
	}
}

// TestRelayKilledAfterPublishBeforeMark: the relay's connection dies after
// the broker confirmed; the rows stay pending and the next cycle sends the
// same message IDs again (which the broker or the inbox drops).
func TestRelayKilledAfterPublishBeforeMark(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	app := "relay-kill-" + b.db.Schema
	pool := b.db.AppPool(t, app, 2)
	ob, err := outbox.New(pool, outbox.Config{Clock: b.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	var kill atomic.Bool
	kill.Store(true)
	rec.after = func() {
		if kill.CompareAndSwap(true, false) {
			for _, pid := range b.db.BackendPIDs(t, app) {
				b.db.Terminate(t, pid)
			}
		}
	}
	relay, err := outbox.NewRelay(ob, rec, outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t, outbox.Message{Topic: "t", Key: "k"}, outbox.Message{Topic: "t"})
	if _, err := relay.Cycle(context.Background()); err == nil {
		t.Fatal("cycle survived its connection being killed")
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE published_at IS NULL"); n != 2 {
		t.Fatalf("pending after kill = %d", n)
	}
	// pg_terminate_backend only signals: the dying backend may hold its row
	// locks a moment longer, and SKIP LOCKED passes over them meanwhile.
	republished := 0
	for deadline := time.Now().Add(10 * time.Second); republished < 2 && time.Now().Before(deadline); {
		if n := cycle(t, relay); n > 0 {
			republished += n
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	if republished != 2 {
		t.Fatalf("re-published %d, want 2", republished)
	}
	_, sends, _ := rec.snapshot()
	for _, id := range ids {
		if sends[id] != 2 {
			t.Fatalf("message %s sent %d times, want 2 (same ID)", id, sends[id])
		}
	}
	if n := cycle(t, relay); n != 0 {
		t.Fatalf("third cycle = %d", n)
	}
}

// TestRelayGracefulShutdownFinishesTheBatch: cancelling Run while a publish
// is in flight lets it finish and records it, so nothing is sent twice.
func TestRelayGracefulShutdownFinishesTheBatch(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	b.outbox, _ = outbox.New(b.db.Pool, outbox.Config{})
	rec := newRecorder()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rec.setFail(func(*outbox.StoredMessage) error {
		once.Do(func() { close(entered); <-release })
		return nil
	})
	stop := runRelay(t, b.relay(t, rec, outbox.RelayConfig{PollInterval: 20 * time.Millisecond}))
	b.enqueue(t, outbox.Message{Topic: "t"})
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("publish never started")
	}
	go func() { time.Sleep(100 * time.Millisecond); close(release) }()
	stop()
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE published_at IS NOT NULL"); n != 1 {
		t.Fatalf("in-flight message not recorded at shutdown: %d", n)
	}
}

// TestRelayCleanupKeepsRetention deletes only published rows past retention,
// and DeletePublished deletes on confirmation.
func TestRelayCleanupKeepsRetention(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	rec := newRecorder()
	relay := b.relay(t, rec, outbox.RelayConfig{Retention: time.Hour})
	b.enqueue(t, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t"})
	cycle(t, relay)
	b.enqueue(t, outbox.Message{Topic: "t"}) // pending: never cleaned
	b.clock.Advance(59 * time.Minute)
	if n, err := relay.Cleanup(context.Background()); err != nil || n != 0 {
		t.Fatalf("early cleanup = %d, %v", n, err)
	}
	b.clock.Advance(2 * time.Minute)
	if n, err := relay.Cleanup(context.Background()); err != nil || n != 2 {
		t.Fatalf("cleanup = %d, %v", n, err)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox"); n != 1 {
		t.Fatalf("rows left = %d", n)
	}
	del := b.relay(t, rec, outbox.RelayConfig{DeletePublished: true})
	if n := cycle(t, del); n != 1 {
		t.Fatal(n)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox"); n != 0 {
		t.Fatalf("rows left after DeletePublished = %d", n)
	}
}

// TestRelayWithoutNotifyWaitsForThePoll: an outbox WithoutNotify enqueues
// without a NOTIFY, so a listening relay is not woken for it; the next
// notification (or poll) publishes it with the rest. Notifications arrive
// in commit order, so a sentinel sent after both enqueues shows exactly
// which of them notified, whatever the machine's speed.
func TestRelayWithoutNotifyWaitsForThePoll(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	b.outbox, _ = outbox.New(b.db.Pool, outbox.Config{})
	quiet := b.outbox.WithoutNotify()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, b.db.Pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var channel string
	if err := conn.QueryRow(ctx, `SELECT 'dedupe_outbox_' || 'dedupe_outbox'::regclass::oid::text`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := quiet.Enqueue(ctx, tx, outbox.Message{Topic: "t", Payload: []byte("quiet")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, outbox.Message{Topic: "t", Payload: []byte("loud")})
	b.db.Exec(t, `SELECT pg_notify($1, 'sentinel')`, channel)
	notified := 0
	for {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for the sentinel: %v", err)
		}
		if n.Payload == "sentinel" {
			break
		}
		notified++
	}
	if notified != 1 {
		t.Fatalf("%d notifications for one loud and one quiet enqueue, want 1", notified)
	}
	rec := newRecorder()
	runRelay(t, b.relay(t, rec, outbox.RelayConfig{PollInterval: time.Minute}))
	waitFor(t, 5*time.Second, "both published", func() bool { got, _, _ := rec.snapshot(); return len(got) == 2 })
}

// TestRelayScanWindowMovesPastBlockedRows: the first windows hold only a
// parked message and the later messages of its key; the relay moves its
// window on and publishes the other keys behind them, while the parked key
// stays held back.
func TestRelayScanWindowMovesPastBlockedRows(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	rec := newRecorder()
	rec.setFail(func(m *outbox.StoredMessage) error {
		if string(m.Payload) == "poison" {
			return dedupe.Permanent(errors.New("never"))
		}
		return nil
	})
	relay := b.relay(t, rec, outbox.RelayConfig{BatchSize: 2, ScanWindow: 3})
	msgs := []outbox.Message{{Topic: "t", Key: "p", Payload: []byte("poison")}}
	for i := range 7 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: "p", Payload: []byte(fmt.Sprint("p", i))})
	}
	for i := range 3 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprint("q", i), Payload: []byte(fmt.Sprint("q", i))})
	}
	b.enqueue(t, msgs...)
	for range 12 {
		if _, err := relay.Cycle(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	got, _, _ := rec.snapshot()
	var names []string
	for _, m := range got {
		names = append(names, string(m.Payload))
	}
	if len(got) != 3 {
		t.Fatalf("published %v, want q0 q1 q2", names)
	}
	for _, m := range got {
		if m.Key == "p" {
			t.Fatalf("held-back key published: %v", names)
		}
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL"); n != 1 {
		t.Fatalf("parked = %d", n)
	}
}

// TestRelayStartsOnAKilledConnection: the pool hands Run a connection whose
// backend was terminated (as after a failover); Run retries instead of
// giving up, and the message is published once.
func TestRelayStartsOnAKilledConnection(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	app := "relay-start-" + b.db.Schema
	pool := b.db.AppPool(t, app, 1)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, pid := range b.db.BackendPIDs(t, app) {
		b.db.Terminate(t, pid)
	}
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	relay, err := outbox.NewRelay(ob, rec, outbox.RelayConfig{PollInterval: 20 * time.Millisecond, MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t, outbox.Message{Topic: "t", Payload: []byte("x")})
	runRelay(t, relay)
	waitFor(t, 10*time.Second, "the publish after the killed connection", func() bool {
		got, _, _ := rec.snapshot()
		return len(got) >= 1
	})
	if _, sends, _ := rec.snapshot(); sends[ids[0]] != 1 {
		t.Fatalf("sent %d times, want 1", sends[ids[0]])
	}
}

func TestRelayRunWithoutOutboxTableIsNotMigrated(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{Lines: []dedupe.Line{dedupe.LineInbox}}); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(db.Pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, newRecorder(), outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := relay.Run(ctx); !errors.Is(err, dedupe.ErrNotMigrated) {
		t.Fatalf("Run without the outbox table = %v, want ErrNotMigrated", err)
	}
}
