package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
	"github.com/exactlyonce/dedupe/internal/redistest"
)

// Two runners (two processes' worth: each its own Redis client and
// consumer name) share the group while every key is added three times at
// once: each key's effect happens exactly once and every entry is acked.
func TestDuplicatesAtOnceAcrossTwoRunners(t *testing.T) {
	b := setup(t, nil)
	obs := observetest.New()
	b = b.observed(t, obs)
	for range 2 {
		cfg := fastConfig(t)
		cfg.Workers = 8
		run(t, newRunner(t, b, redistest.Client(t), cfg, nil))
	}
	keys := ids("order", 100)
	dbtest.Together(3, func(int) {
		for _, k := range keys {
			b.publish(t, k, "ship "+k)
		}
	})
	obs.Wait(t, 20*time.Second, "300 entries handled", func() bool {
		return obs.Handled(dedupe.OutcomeClaimed)+obs.Handled(dedupe.OutcomeDuplicate) >= 300
	})
	dbtest.WaitFor(t, 10*time.Second, "every entry acknowledged", func() bool { return b.pending(t) == 0 && b.unread(t) == 0 })
	if n := b.effects(t); n != len(keys) {
		t.Fatalf("effects = %d, want %d", n, len(keys))
	}
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != len(keys) {
		t.Fatalf("distinct effects = %d, want %d", n, len(keys))
	}
	if c, d := obs.Handled(dedupe.OutcomeClaimed), obs.Handled(dedupe.OutcomeDuplicate); c != 100 || d != 200 {
		t.Fatalf("claimed %d, duplicates %d; want 100 and 200", c, d)
	}
}

// A consumer read entries and died without acknowledging them, after it had
// committed the effects of some: another runner reclaims them all after
// ClaimIdle (their delivery count is 2), commits the others and absorbs
// those as duplicates, and acknowledges every one.
func TestCrashedConsumerReclaimed(t *testing.T) {
	b := setup(t, nil)
	obs := observetest.New()
	var deliveries atomic.Int64
	b = b.observed(t, dedupe.Observers(obs, observetest.OnHandled(func(h dedupe.HandleInfo, _ dedupe.HandleDone) {
		if h.Message.Delivery == 2 {
			deliveries.Add(1)
		}
	})))
	keys := ids("order", 10)
	for _, k := range keys {
		b.publish(t, k, "ship "+k)
	}
	dead := b.readAsDead(t, len(keys))
	// The dead consumer had committed the first five before it died.
	c, err := dedupe.NewConsumer(b.inbox, dedupe.ConsumerConfig[*deduperedis.Message]{
		Scope: group, Key: deduperedis.DefaultKey,
	}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range dead[:5] {
		if _, err := c.Handle(context.Background(), &deduperedis.Message{Stream: b.stream, ID: x.ID, Values: x.Values, Deliveries: 1}); err != nil {
			t.Fatal(err)
		}
	}
	before := obs.Handled(dedupe.OutcomeClaimed)
	cfg := fastConfig(t)
	cfg.ClaimIdle = 300 * time.Millisecond
	run(t, newRunner(t, b, nil, cfg, nil))
	dbtest.WaitFor(t, 20*time.Second, "the dead consumer's entries acknowledged", func() bool { return b.pending(t) == 0 })
	if n := b.effects(t); n != len(keys) {
		t.Fatalf("effects = %d, want %d", n, len(keys))
	}
	if got := obs.Handled(dedupe.OutcomeClaimed) - before; got != 5 {
		t.Fatalf("reclaimed entries processed = %d, want 5", got)
	}
	if got := obs.Handled(dedupe.OutcomeDuplicate); got != 5 {
		t.Fatalf("reclaimed entries found duplicate = %d, want 5", got)
	}
	if got := deliveries.Load(); got != 10 {
		t.Fatalf("handlings at delivery 2 = %d, want 10", got)
	}
}

// Poison of every kind is recorded failed in the inbox, copied to the
// dead-letter stream and acknowledged; the other entries flow.
func TestPoison(t *testing.T) {
	b := setup(t, nil)
	dl := redistest.Stream(t, b.rdb, "dlq")
	var handled atomic.Int64
	cfg := fastConfig(t)
	cfg.MaxAttempts = 3
	cfg.DeadLetterStream = dl
	cfg.Fingerprint = func(m *deduperedis.Message) []byte { return []byte(m.Field("body")) }
	run(t, newRunner(t, b, nil, cfg, func(ctx context.Context, tx pgx.Tx, msg *deduperedis.Message) error {
		handled.Add(1)
		switch msg.Field("id") {
		case "fails":
			return errors.New("cannot decode")
		case "permanent":
			return dedupe.Permanent(errors.New("unknown product"))
		}
		return insertEffect(ctx, tx, msg)
	}))
	b.publish(t, "fails", "x")
	b.publish(t, "permanent", "x")
	noKey, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: []any{"body", "no id"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	b.publish(t, "same", "one payload")
	for _, k := range ids("ok", 10) {
		b.publish(t, k, "fine")
	}
	dbtest.WaitFor(t, 20*time.Second, "11 effects", func() bool { return b.effects(t) >= 11 })
	conflict := b.publish(t, "same", "another payload")
	dbtest.WaitFor(t, 20*time.Second, "every entry acknowledged", func() bool { return b.pending(t) == 0 && b.unread(t) == 0 })
	if n := b.effects(t); n != 11 {
		t.Fatalf("effects = %d, want 11", n)
	}
	for key, attempts := range map[string]int{"fails": 3, "permanent": 1} {
		if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = $1 AND state = 'failed' AND attempts = $2", key, attempts); n != 1 {
			t.Errorf("key %s: not failed after %d attempts", key, attempts)
		}
	}
	for _, id := range []string{noKey, conflict} {
		key := deduperedis.RefusedKey(b.stream, id)
		if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = $1 AND state = 'failed'", key); n != 1 {
			t.Errorf("refused entry %s not recorded failed under %s", id, key)
		}
	}
	copies := deadLetters(t, b.rdb, dl)
	reasons := map[string]string{}
	for _, c := range copies {
		reasons[fmt.Sprint(c.Values[deduperedis.DeadLetterKeyField])] = fmt.Sprint(c.Values[deduperedis.DeadLetterReasonField])
		if c.Values[deduperedis.DeadLetterStreamField] != b.stream || c.Values[deduperedis.DeadLetterGroupField] != group {
			t.Errorf("copy %v does not name its origin", c.Values)
		}
	}
	want := map[string]string{
		"fails":                                 "cannot decode",
		"permanent":                             "unknown product",
		deduperedis.RefusedKey(b.stream, noKey): "no usable key",
		deduperedis.RefusedKey(b.stream, conflict): "different payload",
	}
	if len(copies) != len(want) {
		t.Errorf("dead-letter copies = %d, want %d: %v", len(copies), len(want), reasons)
	}
	for k, w := range want {
		if !strings.Contains(reasons[k], w) {
			t.Errorf("copy of %s: reason %q, want it to mention %q", k, reasons[k], w)
		}
	}
	if n := handled.Load(); n != 3+1+10+1 {
		t.Errorf("handler ran %d times, want 15", n)
	}
}

// An entry whose consumers kept dying with it (its delivery count above
// MaxDeliveries) is recorded failed, dead-lettered and acknowledged without
// its handler running again.
func TestTooManyDeliveries(t *testing.T) {
	b := setup(t, nil)
	dl := redistest.Stream(t, b.rdb, "dlq")
	b.publish(t, "killer", "x")
	dead := b.readAsDead(t, 1)
	// Three more consumers took it and died: XCLAIM counts a delivery each.
	for i := range 3 {
		if err := b.rdb.XClaim(context.Background(), &redis.XClaimArgs{
			Stream: b.stream, Group: group, Consumer: fmt.Sprintf("dead-%d", i), Messages: []string{dead[0].ID},
		}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var handled atomic.Int64
	cfg := fastConfig(t)
	cfg.ClaimIdle = 200 * time.Millisecond
	cfg.MaxDeliveries = 4
	cfg.DeadLetterStream = dl
	run(t, newRunner(t, b, nil, cfg, func(ctx context.Context, tx pgx.Tx, msg *deduperedis.Message) error {
		handled.Add(1)
		return insertEffect(ctx, tx, msg)
	}))
	dbtest.WaitFor(t, 20*time.Second, "the entry acknowledged", func() bool { return b.pending(t) == 0 })
	if n := handled.Load(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'killer' AND state = 'failed' AND last_error LIKE '%delivered too many times%'"); n != 1 {
		t.Fatalf("key not recorded failed for its deliveries")
	}
	if copies := deadLetters(t, b.rdb, dl); len(copies) != 1 || copies[0].Values[deduperedis.DeadLetterDeliveriesField] != "5" {
		t.Fatalf("dead-letter copies: %v, want one with 5 deliveries", copies)
	}
}

// Entries trimmed away while pending are reported when reclaimed: recorded
// failed under their RefusedKey (ErrTrimmed), dead-lettered and reported to
// the Observer, never silently dropped or retried forever.
func TestTrimmedPendingEntries(t *testing.T) {
	b := setup(t, nil)
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	var events []dedupe.TransportEvent
	b = b.observed(t, observetest.OnEvent(func(_ context.Context, e dedupe.TransportEvent) {
		<-mu
		events = append(events, e)
		mu <- struct{}{}
	}))
	dl := redistest.Stream(t, b.rdb, "dlq")
	for _, k := range ids("old", 3) {
		b.publish(t, k, "x")
	}
	dead := b.readAsDead(t, 3)
	// Producers trim the stream: the pending entries' bodies are gone.
	if err := b.rdb.XTrimMaxLen(context.Background(), b.stream, 0).Err(); err != nil {
		t.Fatal(err)
	}
	b.publish(t, "new", "y")
	cfg := fastConfig(t)
	cfg.ClaimIdle = 200 * time.Millisecond
	cfg.DeadLetterStream = dl
	run(t, newRunner(t, b, nil, cfg, nil))
	dbtest.WaitFor(t, 20*time.Second, "nothing pending and three copies", func() bool {
		return b.pending(t) == 0 && len(deadLetters(t, b.rdb, dl)) == 3 && b.effects(t) == 1
	})
	for _, x := range dead {
		key := deduperedis.RefusedKey(b.stream, x.ID)
		if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = $1 AND state = 'failed' AND last_error LIKE '%deleted from the stream%'", key); n != 1 {
			t.Errorf("trimmed entry %s not recorded failed", x.ID)
		}
	}
	for _, c := range deadLetters(t, b.rdb, dl) {
		if c.Values[deduperedis.DeadLetterTrimmedField] != "true" {
			t.Errorf("copy %v not marked trimmed", c.Values)
		}
	}
	<-mu
	defer func() { mu <- struct{}{} }()
	var refused, terminated int
	for _, e := range events {
		if !errors.Is(e.Err, deduperedis.ErrTrimmed) {
			continue
		}
		switch e.Name {
		case dedupe.EventRefused:
			refused++
		case dedupe.EventTerminated:
			terminated++
		}
	}
	if refused != 3 || terminated != 3 {
		t.Fatalf("trimmed events: %d refused, %d terminated; want 3 and 3", refused, terminated)
	}
}

// The runner's connections are killed again and again while it works
// (paced by progress): every entry's effect happens exactly once, and every
// entry ends acknowledged.
func TestConnectionKilledMidRun(t *testing.T) {
	b := setup(t, nil)
	name := redistest.Name("victim")
	victim := redistest.ClientNamed(t, name)
	cfg := fastConfig(t)
	cfg.Workers = 8
	cfg.ClaimIdle = 500 * time.Millisecond
	run(t, newRunner(t, b, victim, cfg, nil))
	keys := ids("order", 300)
	go func() {
		for i, k := range keys {
			b.publish(t, k, "x")
			if i%3 == 0 {
				b.publish(t, k, "x") // a producer's retry
			}
		}
	}()
	kills := 0
	for next := 30; next < len(keys); next += 30 {
		dbtest.WaitFor(t, 20*time.Second, fmt.Sprintf("%d effects", next), func() bool { return b.effects(t) >= next })
		n, err := redistest.Kill(context.Background(), b.rdb, name)
		if err != nil {
			t.Fatal(err)
		}
		kills += n
	}
	dbtest.WaitFor(t, 30*time.Second, "every entry acknowledged", func() bool {
		return b.effects(t) == len(keys) && b.pending(t) == 0 && b.unread(t) == 0
	})
	if n := b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != len(keys) {
		t.Fatalf("distinct effects = %d, want %d", n, len(keys))
	}
	if n := b.effects(t); n != len(keys) {
		t.Fatalf("effects = %d, want %d", n, len(keys))
	}
	if kills < 5 {
		t.Fatalf("killed %d connections, want at least 5 for the test to mean anything", kills)
	}
}

// The stream and its group vanish while the runner runs, as when Redis
// restarts without persistence: the runner creates the group again and
// handles what is added afterwards.
func TestGroupRecreatedAfterLoss(t *testing.T) {
	b := setup(t, nil)
	run(t, newRunner(t, b, nil, fastConfig(t), nil))
	b.publish(t, "before", "x")
	dbtest.WaitFor(t, 20*time.Second, "the first effect", func() bool { return b.effects(t) == 1 })
	redistest.Delete(b.rdb, b.stream)
	for _, k := range ids("after", 5) {
		b.publish(t, k, "x")
	}
	dbtest.WaitFor(t, 20*time.Second, "the effects after the loss", func() bool { return b.effects(t) == 6 })
	dbtest.WaitFor(t, 10*time.Second, "every entry acknowledged", func() bool { return b.pending(t) == 0 && b.unread(t) == 0 })
}

// A stop lets in-flight handlers commit (within DrainTimeout), and their
// entries are acknowledged before Run returns.
func TestShutdownDrains(t *testing.T) {
	b := setup(t, nil)
	started := make(chan struct{}, 4)
	release := make(chan struct{})
	cfg := fastConfig(t)
	r := newRunner(t, b, nil, cfg, func(ctx context.Context, tx pgx.Tx, msg *deduperedis.Message) error {
		started <- struct{}{}
		<-release
		return insertEffect(ctx, tx, msg)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for _, k := range ids("order", 4) {
		b.publish(t, k, "x")
	}
	for range 4 {
		<-started
	}
	cancel()
	time.Sleep(50 * time.Millisecond)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t); n != 4 {
		t.Fatalf("effects = %d, want 4", n)
	}
	if p := b.pending(t); p != 0 {
		t.Fatalf("pending = %d after the drain, want 0", p)
	}
}
