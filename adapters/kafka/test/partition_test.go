package test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// The handler blocks on every message of partition 0: partitions 1–3 are
// handled and committed to the end meanwhile (each partition has its own
// reader; none waits for another), then partition 0 is released and drains.
func TestBlockedPartitionOthersFinish(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const total = 800 // about 200 a partition, far more than any buffer of a partition
	b.produce(t, numbered(total, "p-%d", nil)...)
	release := make(chan struct{})
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	m := b.start(t, dedupekafka.Config{}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if m.Partition == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return insertEffect(ctx, tx, m)
	})
	var lags map[int]int
	dbtest.WaitFor(t, 60*time.Second, "partitions 1-3 committed to the end while partition 0 is blocked", func() bool {
		var err error
		lags, err = partitionLags(context.Background(), b.brokers, b.group, b.topic)
		return err == nil && len(lags) == 4 && lags[1] == 0 && lags[2] == 0 && lags[3] == 0
	})
	if n := b.db.Count(t, "SELECT count(*) FROM effects WHERE part = 0"); n != 0 || lags[0] == 0 {
		t.Fatalf("partition 0: %d effects, lag %d; want none handled while blocked", n, lags[0])
	}
	close(release)
	released = true
	b.waitDrained(t, 60*time.Second)
	b.wantEffects(t, total)
	if m.handled() != total || m.events(dedupe.EventOffsetsCommitted) == 0 {
		t.Fatalf("observed %s, want %d handled and offsets committed", m.obs, total)
	}
}

// Offsets are committed in coalesced requests, not once per message: a
// thousand messages over four partitions take a few commits.
func TestOffsetsCommittedCoalesced(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const total = 1000
	b.produce(t, numbered(total, "c-%d", nil)...)
	const interval = 100 * time.Millisecond
	started := time.Now()
	m := b.start(t, dedupekafka.Config{CommitInterval: interval}, insertEffect)
	b.waitDrained(t, 60*time.Second)
	elapsed := time.Since(started)
	b.wantEffects(t, total)
	commits := m.events(dedupe.EventOffsetsCommitted)
	// One request per interval that saw progress, covering every partition,
	// and the last flush: at most one per interval of the run however slow
	// the machine (a loaded one took 11 s and 107 commits), and well under
	// one a message.
	if most := int64(elapsed/interval) + 2; commits == 0 || commits > most || commits > total/4 {
		t.Fatalf("%d offset commits for %d messages in %v, want at most %d (one per %v) and under %d (observed %s)",
			commits, total, elapsed.Round(time.Millisecond), most, interval, total/4, m.obs)
	}
	t.Logf("%d messages, %d offset commits covering %d partitions", total, commits, m.obs.Covered(dedupe.EventOffsetsCommitted))
}

// A handler in progress when its partition is revoked (a second member
// joins) is cancelled, so the rebalance does not wait for it and its
// transaction rolls back; the partition's new owner handles the message, and
// every effect lands once.
func TestRevokedHandlerCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	const total = 100
	b.produce(t, numbered(total, "r-%d", nil)...)
	started := make(chan struct{})
	var cancelled atomic.Bool
	var blocked atomic.Bool
	b.start(t, dedupekafka.Config{}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if err := insertEffect(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Headers[0].Value) == "r-0" && blocked.CompareAndSwap(false, true) {
			close(started)
			<-ctx.Done() // until the partition is revoked
			cancelled.Store(true)
			return ctx.Err()
		}
		return nil
	})
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never started")
	}
	b.start(t, dedupekafka.Config{}, insertEffect)
	dbtest.WaitFor(t, 30*time.Second, "the blocked handler to be cancelled by the rebalance", cancelled.Load)
	b.waitDrained(t, 45*time.Second)
	b.wantEffects(t, total)
}
