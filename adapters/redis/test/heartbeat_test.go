package test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/redistest"
)

// An entry trimmed away while its runner holds it (its handler still
// running) must stay in the group's pending list: Redis 7's XCLAIM deletes
// a pending entry whose body is gone, so a heartbeat that XCLAIMs it blindly
// erases the only trace of it, and the runner stopping (or dying) with the
// handler unfinished then loses the entry without a record or a copy. Here
// the runner is stopped past its DrainTimeout with the handler blocked; a
// second runner must then reclaim the entry and report it trimmed
// (RefusedKey recorded failed, a dead-letter copy, acknowledged).
func TestTrimmedWhileHeldNotErasedByHeartbeat(t *testing.T) {
	b := setup(t, nil)
	dl := redistest.Stream(t, b.rdb, "dlq")
	started := make(chan struct{}, 1)
	cfg := fastConfig(t)
	cfg.ClaimIdle = 5 * time.Second
	cfg.Heartbeat = 20 * time.Millisecond
	cfg.DrainTimeout = 50 * time.Millisecond
	cfg.DeadLetterStream = dl
	first := newRunner(t, b, nil, cfg, func(ctx context.Context, _ pgx.Tx, _ *deduperedis.Message) error {
		started <- struct{}{}
		<-ctx.Done() // held until the drain's end cancels it
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	id := b.publish(t, "held", "x")
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatal("the handler never started")
	}
	if err := b.rdb.XTrimMaxLen(context.Background(), b.stream, 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Let many heartbeats pass: the entry must stay pending, its idle time
	// growing (nobody can reset it without erasing it).
	dbtest.WaitFor(t, 30*time.Second, "the held entry erased from the pending list or idle for 50 heartbeats", func() bool {
		p, err := b.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
			Stream: b.stream, Group: group, Start: id, End: id, Count: 1,
		}).Result()
		if err != nil {
			t.Fatalf("xpending: %v", err)
		}
		return len(p) == 0 || p[0].Idle >= 50*cfg.Heartbeat
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p := b.pending(t); p != 1 && len(deadLetters(t, b.rdb, dl)) == 0 {
		t.Fatalf("the entry trimmed while held is neither pending (pending = %d) nor dead-lettered: it vanished", p)
	}
	cfg2 := fastConfig(t)
	cfg2.ClaimIdle = 100 * time.Millisecond
	cfg2.DeadLetterStream = dl
	run(t, newRunner(t, b, nil, cfg2, nil))
	dbtest.WaitFor(t, 20*time.Second, "the trimmed entry reported", func() bool {
		return b.pending(t) == 0 && len(deadLetters(t, b.rdb, dl)) == 1
	})
	if c := deadLetters(t, b.rdb, dl)[0]; c.Values[deduperedis.DeadLetterTrimmedField] != "true" || c.Values[deduperedis.DeadLetterIDField] != id {
		t.Fatalf("dead-letter copy %v, want the trimmed entry %s", c.Values, id)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = $1 AND state = 'failed'", deduperedis.RefusedKey(b.stream, id)); n != 1 {
		t.Fatalf("trimmed entry %s not recorded failed", id)
	}
	if n := b.effects(t); n != 0 {
		t.Fatalf("effects = %d, want 0", n)
	}
}

// The heartbeat keeps an entry whose handler runs for many ClaimIdle
// periods: another runner of the group never reclaims it (its delivery
// count stays 1, the handler runs once). Timing is the feature here: the
// heartbeat beats every 50ms against a ClaimIdle of 1s.
func TestHeartbeatKeepsHeldEntry(t *testing.T) {
	b := setup(t, nil)
	started := make(chan struct{}, 4)
	release := make(chan struct{})
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m *deduperedis.Message) error {
		calls.Add(1)
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return insertEffect(ctx, tx, m)
	}
	cfg := fastConfig(t)
	cfg.ClaimIdle = time.Second
	cfg.ClaimInterval = 50 * time.Millisecond
	cfg.Heartbeat = 50 * time.Millisecond
	run(t, newRunner(t, b, nil, cfg, h))
	id := b.publish(t, "slow", "x")
	<-started
	cfg2 := cfg
	cfg2.Consumer = redistest.Name("thief")
	run(t, newRunner(t, b, redistest.Client(t), cfg2, h))
	time.Sleep(4 * cfg.ClaimIdle)
	p, err := b.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: b.stream, Group: group, Start: id, End: id, Count: 1,
	}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 || p[0].RetryCount != 1 || p[0].Consumer != cfg.Consumer {
		t.Fatalf("pending %v, want the entry held by %s with 1 delivery", p, cfg.Consumer)
	}
	close(release)
	dbtest.WaitFor(t, 20*time.Second, "the entry acknowledged", func() bool { return b.pending(t) == 0 && b.effects(t) == 1 })
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
