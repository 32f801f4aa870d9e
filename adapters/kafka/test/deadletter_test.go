package test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// A poisoned message whose dead-letter write keeps failing (the writer's
// broker is unreachable): after DeadLetterAttempts tries its partition
// pauses, reported in the log and to the Observer, with its offset at the poisoned
// message; the other partitions finish. A member with a working dead-letter
// topic then takes the partition over and completes it.
func TestFailingDeadLetterPausesOnlyItsPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const total = 400
	msgs := numbered(total, "d-%d", nil)
	msgs[5].Value = []byte("poison")
	b.produce(t, msgs...)
	tr := &kafka.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	unreachable := &kafka.Writer{Addr: kafka.TCP("127.0.0.1:1"), Topic: "orders.dlq", RequiredAcks: kafka.RequireAll,
		MaxAttempts: 1, Transport: tr}
	var poisonPart, poisonOff atomic.Int64
	poisonPart.Store(-1)
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if string(m.Value) == "poison" {
			poisonOff.Store(m.Offset)
			poisonPart.Store(int64(m.Partition))
			return errors.New("cannot decode")
		}
		return insertEffect(ctx, tx, m)
	}
	cfg := dedupekafka.Config{MaxAttempts: 2, RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond,
		DeadLetter: unreachable, DeadLetterAttempts: 3, CommitInterval: 50 * time.Millisecond}
	m := b.start(t, cfg, h)
	var lags map[int]int
	dbtest.WaitFor(t, 60*time.Second, "the other partitions to finish and the poisoned one to stop at the poison", func() bool {
		p := int(poisonPart.Load())
		var err error
		lags, err = partitionLags(context.Background(), b.brokers, b.group, b.topic)
		// The Observer hears of the pause before the partition's loop
		// logs it as it stops: wait for both.
		if err != nil || p < 0 || len(lags) != 4 || m.events(dedupe.EventPartitionPaused) != 1 ||
			!b.log.contains("partition paused", dedupekafka.ErrPartitionPaused.Error()) {
			return false
		}
		for q, l := range lags {
			if q != p && l != 0 {
				return false
			}
		}
		return true
	})
	p, off := int(poisonPart.Load()), poisonOff.Load()
	if m.events(dedupe.EventDeadLetterFailed) != 3 || m.events(dedupe.EventDeadLettered) != 0 || m.events(dedupe.EventTerminated) != 0 {
		t.Fatalf("want 3 failed dead-letter writes and nothing given up: %s", m.obs)
	}
	if !b.log.contains("pausing the partition", fmt.Sprintf("orders/%d@%d (attempt 3)", p, off), "connection refused") ||
		!b.log.contains("partition paused", dedupekafka.ErrPartitionPaused.Error()) {
		t.Fatal("the dead-letter failure and the pause were not logged")
	}
	// Everything of the poisoned partition before the poison committed,
	// effects and offset; nothing after it was handled.
	ends := b.db.Count(t, "SELECT count(*) FROM effects WHERE part = $1", p)
	if ends != int(off) {
		t.Fatalf("partition %d: %d effects, want the %d before the poison", p, ends, off)
	}
	dbtest.WaitFor(t, 30*time.Second, "the poisoned partition's offset committed up to the poison", func() bool {
		l, err := partitionLags(context.Background(), b.brokers, b.group, b.topic)
		return err == nil && topicSizeOf(t, b, p)-l[p] == int(off)
	})
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'd-5' AND state = 'failed'"); n != 1 {
		t.Fatal("the poison key is not failed in the inbox")
	}
	if err := m.stop(t); err != nil {
		t.Fatal(err)
	}

	// The partition's next owner has a working dead-letter topic.
	cfg.DeadLetter = newWriter(t, b.brokers, "orders.dlq", 1)
	m2 := b.start(t, cfg, h)
	b.waitDrained(t, 60*time.Second)
	b.wantEffects(t, total-1)
	if m2.events(dedupe.EventDeadLettered) != 1 || m2.events(dedupe.EventPartitionPaused) != 0 || m2.events(dedupe.EventTerminated) != 1 {
		t.Fatalf("second member: want the poison dead-lettered: %s", m2.obs)
	}
	if n := topicSize(t, b.brokers, "orders.dlq"); n != 1 {
		t.Fatalf("dead letters = %d, want 1", n)
	}
}

// topicSizeOf is the end offset of partition p of the bundle's topic.
func topicSizeOf(t testing.TB, b *bundle, p int) int {
	t.Helper()
	conn, err := kafka.DialLeader(context.Background(), "tcp", b.brokers[0], b.topic, p)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, last, err := conn.ReadOffsets()
	if err != nil {
		t.Fatal(err)
	}
	return int(last)
}
