package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

func TestSamePublishedThreeTimesDifferentMsgIDsOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := observetest.New()
	var runs atomic.Int64
	r := newRunner(t, b.observed(t, c), b.cons, fastConfig(), func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		runs.Add(1)
		time.Sleep(20 * time.Millisecond) // hold the claim while the copies arrive at the other workers
		return insertEffect(ctx, tx, msg)
	})
	for range 3 {
		b.publish(t, "order-42", "pay 19.00")
	}
	dbtest.Background(t, "runner", r.Run)
	c.Wait(t, 10*time.Second, "three messages acked", func() bool {
		return processed(c)+duplicates(c) == 3 && b.unacked(t) == 0
	})
	if n := b.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	if runs.Load() != 1 || processed(c) != 1 || duplicates(c) != 2 || c.Events(dedupe.EventAckFailed) != 0 {
		t.Fatalf("handler runs = %d, observed %s; want 1 run, 1 claimed, 2 duplicates, no ack failed", runs.Load(), c)
	}
}

func TestDefaultKeyAndScope(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	r := newRunner(t, b, b.cons, &dedupenats.Config{}, nil)
	if r.Scope() != durable {
		t.Fatalf("scope = %q, want the durable name %q", r.Scope(), durable)
	}
	ctx := context.Background()
	for _, body := range []string{"a", "b"} {
		if _, err := b.js.Publish(ctx, "orders.created", []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	// The same Nats-Msg-Id twice: JetStream stores it once.
	for range 2 {
		if _, err := b.js.Publish(ctx, "orders.created", []byte("c"), jetstream.WithMsgID("msg-c")); err != nil {
			t.Fatal(err)
		}
	}
	dbtest.Background(t, "runner", r.Run)
	dbtest.WaitFor(t, 10*time.Second, "three effects", func() bool { return b.effects(t) == 3 && b.unacked(t) == 0 })
	rows, err := b.db.Pool.Query(ctx, "SELECT scope || '/' || key FROM dedupe_inbox ORDER BY key")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"billing/ORDERS:1", "billing/ORDERS:2", "billing/msg-c"}
	if !slices.Equal(keys, want) {
		t.Fatalf("inbox keys = %v, want %v", keys, want)
	}
}

func TestFailTwiceThenSucceedOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var (
		c      = observetest.New()
		mu     sync.Mutex
		calls  int
		delays []time.Duration
	)
	cfg := fastConfig()
	cfg.Backoff = dedupe.Backoff{Min: 10 * time.Millisecond, Max: time.Second}.Delay
	obs := dedupe.Observers(c, observetest.OnEvent(func(_ context.Context, e dedupe.TransportEvent) {
		if e.Name == dedupe.EventRetried {
			mu.Lock()
			delays = append(delays, e.Delay)
			mu.Unlock()
		}
	}))
	r := newRunner(t, b.observed(t, obs), b.cons, cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 2 {
			return fmt.Errorf("downstream unavailable (%d)", calls)
		}
		return nil
	})
	dbtest.Background(t, "runner", r.Run)
	b.publish(t, "flaky", "x")
	c.Wait(t, 15*time.Second, "the third attempt to commit and ack", func() bool {
		return processed(c) == 1 && b.unacked(t) == 0
	})
	if n := b.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	if n := b.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'flaky' AND state = 'complete'"); n != 3 {
		t.Fatalf("attempts = %d, want 3", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}; !slices.Equal(delays, want) {
		t.Fatalf("nak delays = %v, want %v (exponential backoff per attempt)", delays, want)
	}
	if n := c.Handled(dedupe.OutcomeRetry); n != 2 {
		t.Fatalf("failed attempts observed = %d, want 2", n)
	}
}

func TestStoppedBetweenCommitAndAckRedeliveredAsDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{ackWait: time.Second})
	var runs atomic.Int64
	handler := func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		runs.Add(1)
		return insertEffect(ctx, tx, msg)
	}

	// The first consumer process commits, then dies before it acks: its
	// context is cancelled and its connection closed.
	nc1, cons1 := b.conn(t)
	c1 := observetest.New()
	ctx1, cancel1 := context.WithCancel(context.Background())
	var (
		once               sync.Once
		committedAtAckTime atomic.Int64
	)
	r1 := newRunner(t, b.observed(t, c1), beforeAckConsumer{Consumer: cons1, hook: func() {
		once.Do(func() {
			// Seen from another connection: the effect committed before the ack.
			committedAtAckTime.Store(int64(b.effects(t)))
			cancel1()
			nc1.Close()
		})
	}}, fastConfig(), handler)
	done1 := make(chan error, 1)
	go func() { done1 <- r1.Run(ctx1) }()
	b.publish(t, "order-7", "ship")
	select {
	case err := <-done1:
		if err != nil && !errors.Is(err, dedupenats.ErrIteratorClosed) {
			t.Fatalf("first runner: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("first runner did not stop")
	}
	if n := b.effects(t); n != 1 || c1.Events(dedupe.EventAckFailed) != 1 || processed(c1) != 1 {
		t.Fatalf("after the crash: effects = %d, observed %s; want 1 effect, 1 claimed, 1 ack failed", n, c1)
	}
	if n := b.unacked(t); n != 1 {
		t.Fatalf("unacked after the crash = %d, want 1", n)
	}
	if n := committedAtAckTime.Load(); n != 1 {
		t.Fatalf("effects visible when the ack was about to be sent = %d, want 1 (ack only after commit)", n)
	}

	// A second process gets the redelivery after AckWait and acks it as a
	// duplicate without running the handler.
	_, cons2 := b.conn(t)
	c2 := observetest.New()
	dbtest.Background(t, "runner", newRunner(t, b.observed(t, c2), cons2, fastConfig(), handler).Run)
	c2.Wait(t, 10*time.Second, "the redelivery to be acked as a duplicate", func() bool {
		return duplicates(c2) == 1 && b.unacked(t) == 0
	})
	if n := b.effects(t); n != 1 || runs.Load() != 1 || processed(c2) != 0 {
		t.Fatalf("effects = %d, handler runs = %d, processed again = %d; want 1, 1, 0", n, runs.Load(), processed(c2))
	}
}

func TestThousandMessagesThirtyPercentDuplicatesFourWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const total, dupRate = 1000, 0.3
	rng := rand.New(rand.NewPCG(7, 11))
	var ids []string
	unique := map[string]bool{}
	for n := 0; len(ids) < total; n++ {
		id := fmt.Sprintf("order-%d", n)
		if len(ids) > 0 && rng.Float64() < dupRate {
			id = ids[rng.IntN(len(ids))]
		}
		ids = append(ids, id)
		unique[id] = true
	}
	c := observetest.New()
	cfg := fastConfig()
	cfg.Workers = 4
	dbtest.Background(t, "runner", newRunner(t, b.observed(t, c), b.cons, cfg, nil).Run)

	// Publish asynchronously, as a busy producer would, while consuming.
	for _, id := range ids {
		m := nats.NewMsg("orders.created")
		m.Header.Set(jetstream.MsgIDHeader, nuid.Next())
		m.Header.Set(orderIDHdr, id)
		m.Data = []byte(id)
		if _, err := b.js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(20 * time.Second):
		t.Fatal("publishes not acknowledged by the stream")
	}
	c.Wait(t, 40*time.Second, "every message acked", func() bool {
		return processed(c)+duplicates(c) == total && b.unacked(t) == 0
	})
	if n := b.effects(t); n != len(unique) {
		t.Fatalf("effects = %d, want %d unique of %d", n, len(unique), total)
	}
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != len(unique) {
		t.Fatalf("distinct effects = %d, want %d", n, len(unique))
	}
	if processed(c) != int64(len(unique)) || duplicates(c) != int64(total-len(unique)) {
		t.Fatalf("processed = %d, duplicates = %d; want %d and %d",
			processed(c), duplicates(c), len(unique), total-len(unique))
	}
	if c.Events(dedupe.EventRetried) != 0 || c.Events(dedupe.EventTerminated) != 0 || c.Events(dedupe.EventAckFailed) != 0 {
		t.Fatalf("observed %s; want no retry, termination or ack failure", c)
	}
}

func TestPoisonAndPermanentTerminatedOthersFlow(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var (
		c     = observetest.New()
		mu    sync.Mutex
		calls = map[string]int{}
	)
	cfg := fastConfig()
	cfg.MaxAttempts = 3
	r := newRunner(t, b.observed(t, c), b.cons, cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		id := dedupe.ClaimFromContext(ctx).Key.ID
		mu.Lock()
		calls[id]++
		mu.Unlock()
		switch id {
		case "poison":
			return fmt.Errorf("cannot decode %q", msg.Data())
		case "permanent":
			return dedupe.Permanent(errors.New("unknown customer"))
		case "panics":
			panic("nil map")
		}
		return insertEffect(ctx, tx, msg)
	})
	dbtest.Background(t, "runner", r.Run)
	b.publish(t, "poison", "\x00garbage")
	b.publish(t, "permanent", "{}")
	b.publish(t, "panics", "{}")
	// A message without the business-key header has no key at all.
	if _, err := b.js.Publish(context.Background(), "orders.created", []byte("no key")); err != nil {
		t.Fatal(err)
	}
	for n := range 20 {
		b.publish(t, fmt.Sprintf("ok-%d", n), "fine")
	}
	c.Wait(t, 20*time.Second, "20 effects and 4 terminations", func() bool {
		return b.effects(t) == 20 && c.Events(dedupe.EventTerminated) == 4 && b.unacked(t) == 0
	})
	time.Sleep(200 * time.Millisecond) // ten backoffs: a terminated message must not come back
	mu.Lock()
	defer mu.Unlock()
	if calls["poison"] != 3 || calls["permanent"] != 1 || calls["panics"] != 3 {
		t.Fatalf("handler calls = %v, want poison 3, permanent 1, panics 3", calls)
	}
	for key, attempts := range map[string]int{"poison": 3, "permanent": 1, "panics": 3} {
		if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = $1 AND state = 'failed' AND attempts = $2 AND last_error <> ''", key, attempts); n != 1 {
			t.Errorf("key %s not recorded as failed after %d attempts", key, attempts)
		}
	}
	if n := b.effects(t); n != 20 || c.Events(dedupe.EventTerminated) != 4 {
		t.Fatalf("effects = %d, terminated = %d; want 20 and 4", n, c.Events(dedupe.EventTerminated))
	}
	// Three were poisoned by their handlings; the keyless one was refused.
	if c.Handled(dedupe.OutcomePoisoned) != 3 || c.Events(dedupe.EventRefused) != 1 {
		t.Fatalf("observed %s; want 3 poisoned and 1 refused", c)
	}
}

func TestHeartbeatKeepsLongHandlerFromRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{ackWait: time.Second})
	c := observetest.New()
	cfg := fastConfig()
	cfg.Heartbeat = 200 * time.Millisecond
	var runs atomic.Int64
	r := newRunner(t, b.observed(t, c), b.cons, cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		runs.Add(1)
		select { // two and a half AckWaits
		case <-time.After(2500 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		return insertEffect(ctx, tx, msg)
	})
	dbtest.Background(t, "runner", r.Run)
	b.publish(t, "slow", "x")
	c.Wait(t, 10*time.Second, "the slow message acked", func() bool {
		return processed(c) == 1 && b.unacked(t) == 0
	})
	ci, err := b.cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ci.NumRedelivered != 0 || duplicates(c) != 0 || runs.Load() != 1 {
		t.Fatalf("redelivered = %d, duplicates = %d, runs = %d; want 0, 0, 1 (InProgress must hold the message)",
			ci.NumRedelivered, duplicates(c), runs.Load())
	}
}

func TestShutdownNeverAcksUncommittedWork(t *testing.T) {
	t.Parallel()
	// A long AckWait: the released messages must come back at once (Nak),
	// and the wait for them below (10s) stays far from it.
	b := setup(t, setupOpts{ackWait: 2 * time.Minute})
	c1 := observetest.New()
	cfg := fastConfig()
	cfg.DrainTimeout = 100 * time.Millisecond
	started := make(chan struct{}, 8)
	r1 := newRunner(t, b.observed(t, c1), b.cons, cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		started <- struct{}{}
		<-ctx.Done() // stuck until the drain timeout cancels it
		return ctx.Err()
	})
	stop1 := dbtest.Background(t, "runner", r1.Run)
	for n := range 6 {
		b.publish(t, fmt.Sprintf("o-%d", n), "x")
	}
	for range 4 { // every worker is stuck in a transaction
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("handlers did not start")
		}
	}
	// The other two are fetched into the runner's buffer before it stops.
	dbtest.WaitFor(t, 10*time.Second, "all six messages delivered to the runner", func() bool {
		ci, err := b.cons.Info(context.Background())
		return err == nil && ci.NumAckPending == 6
	})
	stop1()
	if n := b.effects(t); n != 0 {
		t.Fatalf("effects after shutdown = %d, want 0 (rolled back)", n)
	}
	// The four stuck ones are released after DrainTimeout, the two buffered
	// ones at once.
	if processed(c1) != 0 || c1.Events(dedupe.EventReleased) != 6 {
		t.Fatalf("processed = %d, released = %d; want 0 and 6", processed(c1), c1.Events(dedupe.EventReleased))
	}
	if n := b.unacked(t); n != 6 {
		t.Fatalf("unacked after shutdown = %d, want 6", n)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != 0 {
		t.Fatalf("inbox rows after shutdown = %d, want 0 (a shutdown is not a failed attempt)", n)
	}

	// The next consumer gets all of them at once (Nak, not AckWait) and
	// processes each exactly once.
	c2 := observetest.New()
	dbtest.Background(t, "runner", newRunner(t, b.observed(t, c2), b.cons, fastConfig(), nil).Run)
	c2.Wait(t, 10*time.Second, "six messages processed by the second runner", func() bool {
		return processed(c2) == 6 && b.unacked(t) == 0
	})
	if n := b.effects(t); n != 6 || duplicates(c2) != 0 {
		t.Fatalf("effects = %d, duplicates = %d; want 6 and 0", n, duplicates(c2))
	}
}

func TestShutdownLetsInFlightWorkCommitWithinDrainTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := observetest.New()
	started := make(chan struct{}, 1)
	r := newRunner(t, b.observed(t, c), b.cons, fastConfig(), func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		return insertEffect(ctx, tx, msg)
	})
	stop := dbtest.Background(t, "runner", r.Run)
	b.publish(t, "o-1", "x")
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler did not start")
	}
	stop()
	if n := b.effects(t); n != 1 || processed(c) != 1 {
		t.Fatalf("effects = %d, processed = %d; want 1 and 1", n, processed(c))
	}
	if n := b.unacked(t); n != 0 {
		t.Fatalf("unacked = %d, want 0", n)
	}
}

func TestDatabaseConnectionKilledMidHandlerRetriedOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var (
		c     = observetest.New()
		kills atomic.Int64
	)
	r := newRunner(t, b.observed(t, c), b.cons, fastConfig(), func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		if kills.Add(1) == 1 {
			var pid uint32
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			b.db.Terminate(t, pid) // the transaction's connection dies under it
		}
		return nil
	})
	dbtest.Background(t, "runner", r.Run)
	b.publish(t, "o-1", "x")
	c.Wait(t, 15*time.Second, "the message processed after the kill", func() bool {
		return processed(c) == 1 && b.unacked(t) == 0
	})
	if n := b.effects(t); n != 1 || c.Events(dedupe.EventRetried) < 1 {
		t.Fatalf("effects = %d, retries = %d; want 1 and at least 1", n, c.Events(dedupe.EventRetried))
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{ackWait: time.Second})
	cases := map[string]*dedupenats.Config{
		"heartbeat not below AckWait": {Heartbeat: time.Second},
		"negative workers":            {Workers: -1},
		"negative lock timeout":       {LockTimeout: -time.Second},
		"scope with control char":     {Scope: "a\x00b"},
		"unknown ack mode":            {AckMode: 7},
		"dead letter without js":      {DeadLetterSubject: "dlq.orders"},
		"negative pull expiry":        {PullExpiry: -time.Second},
	}
	for name, cfg := range cases {
		if _, err := dedupenats.New(b.inbox, b.cons, *cfg, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := dedupenats.New(nil, b.cons, dedupenats.Config{}, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Errorf("nil inbox: err = %v", err)
	}
	r, err := dedupenats.New(b.inbox, b.cons, dedupenats.Config{}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Config(); got.Workers != 4 || got.Heartbeat != time.Second/3 || got.MaxPending != 64 || got.AckMode != dedupenats.AckDouble {
		t.Fatalf("defaults = workers %d, heartbeat %v, pending %d", got.Workers, got.Heartbeat, got.MaxPending)
	}
}

func TestConcurrentDuplicateInFlightNakedWithDelay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var (
		c      = observetest.New()
		mu     sync.Mutex
		delays []time.Duration
		runs   atomic.Int64
	)
	cfg := fastConfig()
	cfg.LockTimeout = 50 * time.Millisecond
	cfg.InFlightDelay = 150 * time.Millisecond
	inFlight := make(chan struct{})
	var once sync.Once
	obs := dedupe.Observers(c, observetest.OnEvent(func(_ context.Context, e dedupe.TransportEvent) {
		if e.Name == dedupe.EventRetried && errors.Is(e.Err, dedupe.ErrInFlight) {
			mu.Lock()
			delays = append(delays, e.Delay)
			mu.Unlock()
			once.Do(func() { close(inFlight) })
		}
	}))
	r := newRunner(t, b.observed(t, obs), b.cons, cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
		runs.Add(1)
		// Hold the claim's row lock until the other copy was naked as in
		// flight: paced by that, not by a sleep a loaded machine outlasts.
		select {
		case <-inFlight:
		case <-ctx.Done():
			return ctx.Err()
		}
		return insertEffect(ctx, tx, msg)
	})
	dbtest.Background(t, "runner", r.Run)
	b.publish(t, "order-1", "x")
	b.publish(t, "order-1", "x")
	c.Wait(t, 10*time.Second, "both copies acked", func() bool {
		return processed(c) == 1 && duplicates(c) == 1 && b.unacked(t) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(delays) == 0 || int64(len(delays)) != c.Handled(dedupe.OutcomeInFlight) {
		t.Fatalf("in-flight naks = %d, in-flight handlings observed = %d; want as many, at least 1", len(delays), c.Handled(dedupe.OutcomeInFlight))
	}
	for _, d := range delays {
		if d != 150*time.Millisecond {
			t.Fatalf("in-flight nak delay = %v, want InFlightDelay", d)
		}
	}
	if n := b.effects(t); n != 1 || runs.Load() != 1 {
		t.Fatalf("effects = %d, runs = %d; want 1 and 1", n, runs.Load())
	}
}

func TestConsumerSettingsThatBreakTheGuarantee(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := context.Background()
	// AckAll would acknowledge messages other workers have not committed.
	_, err := dedupenats.Open(ctx, b.inbox, b.js, streamName,
		jetstream.ConsumerConfig{Durable: "ackall", AckPolicy: jetstream.AckAllPolicy}, dedupenats.Config{}, insertEffect)
	if !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("Open with AckAll: err = %v, want ErrInvalidConfig", err)
	}
	cons, err := b.js.CreateOrUpdateConsumer(ctx, streamName, jetstream.ConsumerConfig{Durable: "ackall", AckPolicy: jetstream.AckAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dedupenats.New(b.inbox, cons, dedupenats.Config{}, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("New with an AckAll consumer: err = %v, want ErrInvalidConfig", err)
	}
	if _, err := dedupenats.Open(ctx, b.inbox, b.js, streamName, jetstream.ConsumerConfig{}, dedupenats.Config{}, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("Open without a durable: err = %v, want ErrInvalidConfig", err)
	}

	// MaxDeliver below the inbox's attempts: the runner terminates on the
	// last delivery JetStream makes, so the failure is recorded.
	r, err := dedupenats.Open(ctx, b.inbox, b.js, streamName,
		jetstream.ConsumerConfig{Durable: "capped", MaxDeliver: 2}, dedupenats.Config{}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Config().MaxAttempts; got != 2 {
		t.Fatalf("MaxAttempts = %d, want MaxDeliver 2", got)
	}
	if _, err := dedupenats.Open(ctx, b.inbox, b.js, streamName, jetstream.ConsumerConfig{Durable: "capped", MaxDeliver: 2},
		dedupenats.Config{MaxAttempts: 5}, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("MaxAttempts above MaxDeliver: err = %v, want ErrInvalidConfig", err)
	}
}

func TestMaxDeliverPoisonRecordedOnLastDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := observetest.New()
	cfg := fastConfig()
	r, err := dedupenats.Open(context.Background(), b.observed(t, c).inbox, b.js, streamName,
		jetstream.ConsumerConfig{Durable: "capped", FilterSubject: "orders.created", MaxDeliver: 3, AckWait: 2 * time.Second},
		*cfg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error { return errors.New("always fails") })
	if err != nil {
		t.Fatal(err)
	}
	dbtest.Background(t, "runner", r.Run)
	b.publish(t, "doomed", "x")
	c.Wait(t, 10*time.Second, "the message terminated", func() bool { return c.Events(dedupe.EventTerminated) == 1 })
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'doomed' AND state = 'failed' AND attempts = 3"); n != 1 {
		t.Fatal("the poison key was not recorded as failed after MaxDeliver attempts")
	}
	if c.Events(dedupe.EventRetried) != 2 || c.Handled(dedupe.OutcomeRetry) != 2 || c.Handled(dedupe.OutcomePoisoned) != 1 {
		t.Fatalf("observed %s; want 2 retried, then poisoned", c)
	}
}

// beforeAckConsumer wraps a consumer so that hook runs when the runner is
// about to acknowledge a message: after its commit, before its ack.
type beforeAckConsumer struct {
	jetstream.Consumer
	hook func()
}

func (c beforeAckConsumer) Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(batch, opts...)
	if err != nil {
		return b, err
	}
	out := make(chan jetstream.Msg)
	go func() { // ends when the fetch's channel closes
		defer close(out)
		for m := range b.Messages() {
			out <- &beforeAckMsg{Msg: m, hook: c.hook}
		}
	}()
	return beforeAckBatch{MessageBatch: b, msgs: out}, nil
}

type beforeAckBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b beforeAckBatch) Messages() <-chan jetstream.Msg { return b.msgs }

type beforeAckMsg struct {
	jetstream.Msg
	hook func()
}

func (m *beforeAckMsg) DoubleAck(ctx context.Context) error {
	m.hook()
	return m.Msg.DoubleAck(ctx)
}

func (m *beforeAckMsg) Ack() error {
	m.hook()
	return m.Msg.Ack()
}

// TestMaxDeliverPoisonRecordedOnLastDeliveryDatabaseSQL is
// TestMaxDeliverPoisonRecordedOnLastDelivery with the inbox over
// database/sql (dedupe.SQL over pgx's stdlib), through Open, with a *sql.Tx
// handler that writes its effect and fails: the last-delivery wrapper serves
// it too, the key is recorded as failed at the last delivery, and none of
// the effects written through the *sql.Tx committed.
func TestMaxDeliverPoisonRecordedOnLastDeliveryDatabaseSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	sqlDB, err := sql.Open("pgx", b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = sqlDB.Close() })
	c := observetest.New()
	inbox, err := dedupe.New(dedupe.SQL(sqlDB), dedupe.Config{Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	r, err := dedupenats.Open(context.Background(), inbox, b.js, streamName,
		jetstream.ConsumerConfig{Durable: "capped", FilterSubject: "orders.created", MaxDeliver: 3, AckWait: 2 * time.Second},
		*fastConfig(), func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
			runs.Add(1)
			if _, err := tx.ExecContext(ctx, "INSERT INTO effects (msg_id, body) VALUES ($1, $2)",
				dedupe.ClaimFromContext(ctx).Key.ID, msg.Data()); err != nil {
				return err
			}
			return errors.New("always fails")
		})
	if err != nil {
		t.Fatal(err)
	}
	dbtest.Background(t, "runner", r.Run)
	b.publish(t, "doomed", "x")
	c.Wait(t, 10*time.Second, "the message terminated", func() bool { return c.Events(dedupe.EventTerminated) == 1 })
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'doomed' AND state = 'failed' AND attempts = 3"); n != 1 {
		t.Fatalf("the poison key was not recorded as failed after MaxDeliver attempts (inbox: %v)", inboxRows(t, b))
	}
	if n := b.effects(t); n != 0 || runs.Load() != 3 {
		t.Fatalf("effects = %d, runs = %d; want 0 effects (rolled back) of 3 runs", n, runs.Load())
	}
	if c.Events(dedupe.EventRetried) != 2 || c.Handled(dedupe.OutcomeRetry) != 2 || c.Handled(dedupe.OutcomePoisoned) != 1 {
		t.Fatalf("observed %s; want 2 retried, then poisoned", c)
	}
}
