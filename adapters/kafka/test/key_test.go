package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// keyless returns n messages without a key header.
func keyless(n int, tag string) []kafka.Message {
	ms := make([]kafka.Message, n)
	for i := range ms {
		ms[i] = kafka.Message{Value: []byte(fmt.Sprintf("%s-%d", tag, i))}
	}
	return ms
}

// recreate deletes the bundle's topic and creates it again, empty: its
// offsets restart at 0 and the group's committed offsets are gone.
func (b *bundle) recreate(t *testing.T, partitions int) {
	t.Helper()
	b.deleteTopic(t)
	b.createTopic(t, partitions)
}

// deleteTopic deletes the bundle's topic.
func (b *bundle) deleteTopic(t *testing.T) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: 10 * time.Second}
	if _, err := cl.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{b.topic}}); err != nil {
		t.Fatalf("delete topic: %v", err)
	}
}

// createTopic creates the bundle's topic (again) with partitions.
func (b *bundle) createTopic(t *testing.T, partitions int) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: 10 * time.Second}
	ctx := context.Background()
	dbtest.WaitFor(t, 30*time.Second, "the topic to be created again", func() bool {
		res, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: b.topic, NumPartitions: partitions, ReplicationFactor: 1}}})
		if err != nil {
			return false
		}
		if e := res.Errors[b.topic]; e != nil && !errors.Is(e, kafka.TopicAlreadyExists) {
			return false
		}
		// Created now, or already by a running member's metadata request
		// (the broker creates topics on demand): either way with the
		// partitions asked for.
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{b.topic}})
		return err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions
	})
}

// Messages without a key header are refused by default, never keyed by
// their offset: each is recorded failed under its RefusedKey and
// dead-lettered. After the topic is deleted and recreated (its offsets
// restart at 0), the new keyless messages are refused too, none dropped as a
// duplicate of an old message at the same offset.
func TestKeylessRefusedAcrossTopicRecreation(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	dlq := newWriter(t, b.brokers, "orders.dlq", 1)
	cfg := dedupekafka.Config{DeadLetter: dlq}
	b.produce(t, keyless(5, "old")...)
	m1 := b.start(t, cfg, insertEffect)
	b.waitDrained(t, 30*time.Second)
	if err := m1.stop(t); err != nil {
		t.Fatal(err)
	}
	b.recreate(t, 1)
	b.produce(t, keyless(8, "new")...)
	m2 := b.start(t, cfg, insertEffect)
	b.waitDrained(t, 30*time.Second)

	if n := b.effects(t); n != 0 {
		t.Fatalf("effects = %d, want none: a message without a key is not handled", n)
	}
	if m1.events(dedupe.EventTerminated) != 5 || m2.events(dedupe.EventTerminated) != 8 || m2.duplicates() != 0 ||
		m2.events(dedupe.EventDeadLettered) != 8 || m2.events(dedupe.EventRefused) != 8 || m2.obs.Started("") != 0 {
		t.Fatalf("want 5 then 8 refused and dead-lettered, never handled: %s; %s", m1.obs, m2.obs)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'failed' AND key LIKE $1 AND last_error LIKE '%no usable key%'",
		dedupekafka.RefusedKeyPrefix+"orders/0/%"); n != 13 {
		t.Fatalf("refused keys in the inbox = %d, want 13", n)
	}
	if n := topicSize(t, b.brokers, "orders.dlq"); n != 13 {
		t.Fatalf("dead letters = %d, want 13", n)
	}
	if !b.log.contains("giving up on message", dedupekafka.ErrMissingKey.Error()) {
		t.Fatal("the refusal was not logged with ErrMissingKey")
	}
}

// Without a dead-letter topic a refused message stays visible as a failed
// key in the inbox, under a key that names where it is in Kafka, and its
// offset is committed; the keyed messages around it flow.
func TestKeylessWithoutDeadLetterRecordedFailed(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			b.produce(t, msg("k-1", "", nil), kafka.Message{Value: []byte("no key")}, msg("k-2", "", nil))
			m := b.start(t, dedupekafka.Config{BatchSize: batch, Linger: 100 * time.Millisecond}, insertEffect)
			b.waitDrained(t, 30*time.Second)
			b.wantEffects(t, 2)
			if m.events(dedupe.EventTerminated) != 1 || m.events(dedupe.EventRefused) != 1 || m.handled() != 2 {
				t.Fatalf("want 2 handled and 1 refused: %s", m.obs)
			}
			rows, err := b.db.Pool.Query(context.Background(), "SELECT key FROM dedupe_inbox WHERE state = 'failed'")
			if err != nil {
				t.Fatal(err)
			}
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != 1 || !strings.HasPrefix(keys[0], dedupekafka.RefusedKeyPrefix+"orders/0/1/") {
				t.Fatalf("failed keys %q, want the refused message's at orders/0/1", keys)
			}
			rec, err := b.inbox.Lookup(context.Background(), dedupe.Key{Scope: b.group, ID: keys[0]})
			if err != nil || rec.State != dedupe.StateFailed {
				t.Fatalf("lookup %s: %+v, %v", keys[0], rec, err)
			}
		})
	}
}

// With OffsetKeyFallback (opt-in) a message without a key header is keyed by
// topic/partition/offset and handled.
func TestOffsetKeyFallbackOptIn(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, keyless(3, "fb")...)
	m := b.start(t, dedupekafka.Config{OffsetKeyFallback: true}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (msg_id, part, off) VALUES ($1, $2, $3)", dedupe.ClaimFromContext(ctx).Key.ID, m.Partition, m.Offset)
		return err
	})
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 3)
	if n := b.db.Count(t, "SELECT count(*) FROM effects WHERE msg_id = 'orders/0/' || off"); n != 3 {
		t.Fatalf("effects keyed by offset = %d, want 3", n)
	}
	if m.handled() != 3 || m.events(dedupe.EventTerminated) != 0 {
		t.Fatalf("observed %s, want 3 handled", m.obs)
	}
}

// A key function's error refuses the message the same way.
func TestKeyFuncErrorRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, msg("k-1", "", nil), msg("k-2", "", []byte("bad")))
	m := b.start(t, dedupekafka.Config{Key: func(m kafka.Message) (string, error) {
		if string(m.Value) == "bad" {
			return "", errors.New("no order id in body")
		}
		return dedupekafka.KeyFromHeaders(m, "Idempotency-Key"), nil
	}}, insertEffect)
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 1)
	if m.events(dedupe.EventTerminated) != 1 || m.events(dedupe.EventRefused) != 1 {
		t.Fatalf("observed %s, want 1 refused", m.obs)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'failed' AND last_error LIKE '%no order id in body%'"); n != 1 {
		t.Fatal("the refused message is not failed in the inbox with its reason")
	}
}

// A topic deleted and recreated under a running member: the deletion starts
// a new generation (partition changes are watched), which reads the group's
// offsets again (gone with the old topic), or the reader finds its offset
// beyond the new partition's end; either way the new topic's messages are
// all handled from offset 0, none skipped.
func TestTopicRecreatedUnderRunningMember(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, numbered(5, "old-%d", nil)...)
	m := b.start(t, dedupekafka.Config{CommitInterval: 50 * time.Millisecond}, insertEffect, func(rc *kafka.ReaderConfig) {
		rc.PartitionWatchInterval = 50 * time.Millisecond
	})
	b.waitDrained(t, 30*time.Second)
	// The member must notice the old topic's end before the new one holds
	// messages (at offset 5 of a new topic of 8 it would read on from 5):
	// paced by the member's progress (its log), not by time, which a loaded
	// machine stretches past the recreation. It notices one of two ways: its
	// partition watcher sees the partition vanish (a new generation), or,
	// when its own metadata request has already created the topic again
	// (the broker creates topics on demand), its reader finds offset 5
	// beyond the new, empty partition's end. Both resume at offset 0.
	b.deleteTopic(t)
	dbtest.WaitFor(t, 30*time.Second, "the member to notice its topic's end", func() bool {
		return b.log.contains("a partition vanished") || b.log.contains("beyond the end of the partition")
	})
	b.createTopic(t, 1)
	b.produce(t, numbered(8, "new-%d", nil)...)
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 13)
	if m.handled() != 13 || m.duplicates() != 0 {
		t.Fatalf("observed %s, want 13 handled", m.obs)
	}
}

// The topic is deleted and recreated while the member's fetch is on its way
// (held by the broker here, which a loaded machine or a slow network does on
// its own): the fetch reaches the new, empty topic at the old offset before
// any partition watcher saw the old one vanish, so no "unknown partition"
// ever reaches the member. The broker answers offset out of range; kafka-go
// (v0.4.51) then reconnects, and the new reader finds offset 5 beyond the
// partition's end, which the runner resumes at offset 0. Had it fetched on
// at offset 5, the new topic's first five messages would be skipped once
// the topic reached it.
func TestTopicRecreatedUnderInFlightFetch(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, numbered(5, "old-%d", nil)...)
	m := b.start(t, dedupekafka.Config{CommitInterval: 50 * time.Millisecond}, insertEffect, func(rc *kafka.ReaderConfig) {
		rc.PartitionWatchInterval = time.Hour // the watcher must not see the deletion first
		// kafka-go reads a fetch's reply under a deadline of MaxWait: long
		// enough for the held fetch to outlast a deletion and a creation on
		// a loaded machine (a reply that times out instead reconnects, and
		// finds the offset out of range the way the test above does).
		rc.MaxWait = 3 * time.Second
	})
	b.waitDrained(t, 30*time.Second)

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.kfake.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fr := req.(*kmsg.FetchRequest)
		at5 := false
		for _, ft := range fr.Topics {
			for _, p := range ft.Partitions {
				at5 = at5 || ft.Topic == b.topic && p.FetchOffset == 5
			}
		}
		if !at5 {
			return nil, nil, false
		}
		first := false
		once.Do(func() { first = true })
		if first {
			close(held)
			b.kfake.SleepControl(func() { <-release })
			b.kfake.DropControl()
		}
		return nil, nil, false // the broker answers it, from its state now
	})
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the member sent no fetch at offset 5 within 30s")
	}
	b.recreate(t, 1)
	close(release)
	dbtest.WaitFor(t, 30*time.Second, "the member to notice its offset is past the new topic's end", func() bool {
		return b.log.contains("beyond the end of the partition") || b.log.contains("a partition vanished")
	})
	b.produce(t, numbered(8, "new-%d", nil)...)
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 13)
	if m.handled() != 13 || m.duplicates() != 0 {
		t.Fatalf("observed %s, want 13 handled", m.obs)
	}
}

// A committed offset beyond the end of the partition (the topic was
// recreated, or truncated, while no member ran) is logged and consumption
// resumes at the first offset instead of waiting for the partition to grow
// past it.
func TestCommittedOffsetBeyondEndResumesAtFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, numbered(3, "r-%d", nil)...)
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: 10 * time.Second}
	res, err := cl.OffsetCommit(context.Background(), &kafka.OffsetCommitRequest{GroupID: b.group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{b.topic: {{Partition: 0, Offset: 100}}}})
	if err != nil || res.Topics[b.topic][0].Error != nil {
		t.Fatalf("commit offset 100: %v %+v", err, res)
	}
	m := b.start(t, dedupekafka.Config{}, insertEffect)
	dbtest.WaitFor(t, 30*time.Second, "the three messages", func() bool { return b.effects(t) == 3 })
	b.wantEffects(t, 3)
	if !b.log.contains("beyond the end of the partition", "resuming at its first offset") {
		t.Fatal("the out-of-range offset was not logged")
	}
	// The observer hears of a handling after its COMMIT's reply, which can
	// come after the effects are visible: awaited, not read once.
	dbtest.WaitFor(t, 30*time.Second, "three handlings observed", func() bool { return m.handled() >= 3 })
	if m.handled() != 3 {
		t.Fatalf("observed %s, want 3 handled", m.obs)
	}
}

// Retention deleted messages of a partition before the group consumed them
// (the log now starts past the committed offset): they cannot be delivered,
// and the runner says so, as an error naming the lost offsets; the rest is
// handled.
func TestRetentionLossLogged(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, numbered(10, "t-%d", nil)...)
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: 10 * time.Second}
	ctx := context.Background()
	res, err := cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: b.group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{b.topic: {{Partition: 0, Offset: 2}}}})
	if err != nil || res.Topics[b.topic][0].Error != nil {
		t.Fatalf("commit offset 2: %v %+v", err, res)
	}
	deleteRecordsBefore(t, b.brokers, b.topic, 0, 5) // what retention does
	m := b.start(t, dedupekafka.Config{}, insertEffect)
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 5)
	if m.handled() != 5 {
		t.Fatalf("observed %s, want 5 handled", m.obs)
	}
	if !b.log.contains("ERROR", "retention deleted messages", "first_lost=2", "last_lost=4") {
		t.Fatal("the lost offsets were not logged as an error")
	}
}
