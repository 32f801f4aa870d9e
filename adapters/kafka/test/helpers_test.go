package test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/kafkatest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// cluster starts an in-process Kafka-protocol broker whose group
// coordinator accepts the short session timeouts the tests use, with topics
// seeded with partitions.
func cluster(t testing.TB, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	return kafkatest.New(t, partitions, topics, []kfake.Opt{kfake.GroupMinSessionTimeout(100 * time.Millisecond)})
}

// readerConfig returns a group reader configuration tuned for fast joins
// and rebalances on loopback. MaxWait is also the read deadline of each
// fetch (kafka-go asks the broker to answer a little before it): a short one
// (it was 50ms, with ReadBatchTimeout 50ms) times out every fetch on a
// loaded machine, and the reader reconnects forever without reading (seen
// under .ci/stress). The broker answers a fetch as soon as a message
// arrives, so the longer wait adds no delivery latency; what it costs is a
// reader's Close (a generation change, a stop), which waits up to MaxWait
// for an idle partition's fetch.
func readerConfig(brokers []string, group, topic string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers:           brokers,
		GroupID:           group,
		Topic:             topic,
		StartOffset:       kafka.FirstOffset,
		MaxWait:           500 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    1500 * time.Millisecond,
		RebalanceTimeout:  1500 * time.Millisecond,
		JoinGroupBackoff:  100 * time.Millisecond,
		ReadBackoffMin:    10 * time.Millisecond,
		ReadBackoffMax:    100 * time.Millisecond,
		QueueCapacity:     1000,
		MaxBytes:          4 << 20,
	}
}

// newWriter returns a synchronous writer hashing message keys onto
// partitions; batch > 1 buffers up to that many messages per request.
func newWriter(t testing.TB, brokers []string, topic string, batch int) *kafka.Writer {
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		BatchSize:    batch,
		BatchTimeout: time.Millisecond,
		BatchBytes:   16 << 20,
		RequiredAcks: kafka.RequireAll,
		Transport:    &kafka.Transport{},
	}
	t.Cleanup(func() {
		_ = w.Close()
		w.Transport.(*kafka.Transport).CloseIdleConnections()
	})
	return w
}

// msg builds a message whose dedup key header is id and whose partition is
// chosen by orderKey (id when empty).
func msg(id, orderKey string, body []byte) kafka.Message {
	if orderKey == "" {
		orderKey = id
	}
	return kafka.Message{Key: []byte(orderKey), Value: body,
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(id)}}}
}

// groupLag is the number of messages of topic past the group's committed
// offsets, read from the broker.
func groupLag(ctx context.Context, brokers []string, group, topic string) (int, error) {
	lags, err := partitionLags(ctx, brokers, group, topic)
	lag := 0
	for _, l := range lags {
		lag += l
	}
	return lag, err
}

// partitionLags is, per partition of topic, the number of messages past the
// group's committed offset, read from the broker.
func partitionLags(ctx context.Context, brokers []string, group, topic string) (map[int]int, error) {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 5 * time.Second}
	meta, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, err
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return nil, fmt.Errorf("metadata of %s: %+v", topic, meta.Topics)
	}
	var parts []int
	var reqs []kafka.OffsetRequest
	for _, p := range meta.Topics[0].Partitions {
		parts = append(parts, p.ID)
		reqs = append(reqs, kafka.LastOffsetOf(p.ID))
	}
	lo, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, err
	}
	of, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return nil, err
	}
	if of.Error != nil {
		return nil, of.Error
	}
	committed := map[int]int64{}
	for _, p := range of.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		committed[p.Partition] = max(p.CommittedOffset, 0)
	}
	lags := map[int]int{}
	for _, p := range lo.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		lags[p.Partition] = int(p.LastOffset - committed[p.Partition])
	}
	return lags, nil
}

// bundle is what setup gives a test.
type bundle struct {
	log     *testLog
	db      *dbtest.DB
	inbox   *dedupe.Inbox
	kfake   *kfake.Cluster // the broker, for tests that hold its requests
	brokers []string
	topic   string
	group   string
}

// setup migrates a fresh schema with an effects table and starts a broker
// with topics "orders" and "orders.dlq" of partitions partitions.
func setup(t *testing.T, partitions int32) *bundle {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 8})
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_id text NOT NULL, part int, off bigint, body bytea)`)
	log := newTestLog(t)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{Logger: log.logger})
	if err != nil {
		t.Fatal(err)
	}
	c := cluster(t, partitions, "orders", "orders.dlq")
	return &bundle{log: log, db: db, inbox: inbox, kfake: c, brokers: c.ListenAddrs(), topic: "orders", group: "billing"}
}

// insertEffect is the business write of the tests' handlers.
func insertEffect(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
	id := dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...)
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_id, part, off, body) VALUES ($1, $2, $3, $4)", id, m.Partition, m.Offset, m.Value)
	return err
}

func (b *bundle) produce(t testing.TB, msgs ...kafka.Message) {
	t.Helper()
	const chunk = 1000 // a produce request stays under the broker's 1 MiB limit
	w := newWriter(t, b.brokers, b.topic, min(max(len(msgs), 1), chunk))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(msgs) > 0 {
		n := min(len(msgs), chunk)
		if err := w.WriteMessages(ctx, msgs[:n]...); err != nil {
			e := err.Error()
			t.Fatalf("produce: %s", e[:min(len(e), 300)])
		}
		msgs = msgs[n:]
	}
}

func (b *bundle) effects(t testing.TB) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM effects")
}

// wantEffects fails the test unless the effects are n rows of n distinct
// keys: every message's effect once, none lost, none doubled.
func (b *bundle) wantEffects(t testing.TB, n int) {
	t.Helper()
	if got, distinct := b.effects(t), b.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); got != n || distinct != n {
		t.Fatalf("effects = %d of %d distinct keys, want %d of %d", got, distinct, n, n)
	}
}

// numbered returns n messages with body, the i-th keyed fmt.Sprintf(format, i).
func numbered(n int, format string, body []byte) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range n {
		msgs[i] = msg(fmt.Sprintf(format, i), "", body)
	}
	return msgs
}

// member is one running group member, with an inbox of its own whose
// Observer counts what the member did.
type member struct {
	runner *dedupekafka.Runner
	obs    *observetest.Observer
	cancel context.CancelFunc
	done   chan error
	once   atomic.Bool
}

// handled is how many messages the member handled, their effects committed.
func (m *member) handled() int64 { return m.obs.Handled(dedupe.OutcomeClaimed) }

// duplicates is how many messages the member found complete.
func (m *member) duplicates() int64 { return m.obs.Handled(dedupe.OutcomeDuplicate) }

// events is how many transport events named name the member reported.
func (m *member) events(name string) int64 { return m.obs.Events(name) }

// start runs a Runner of the bundle's group and stops it at cleanup; tune
// edits its reader configuration.
func (b *bundle) start(t *testing.T, cfg dedupekafka.Config, h dedupekafka.HandlerFunc, tune ...func(*kafka.ReaderConfig)) *member {
	t.Helper()
	return b.startWith(t, dedupe.Config{}, func(inbox *dedupe.Inbox, rc kafka.ReaderConfig) (*dedupekafka.Runner, error) {
		return dedupekafka.New(inbox, rc, cfg, h)
	}, tune...)
}

// startBatch is start for a batch handler (NewBatch).
func (b *bundle) startBatch(t *testing.T, cfg dedupekafka.Config, h dedupekafka.BatchHandlerFunc) *member {
	t.Helper()
	return b.startWith(t, dedupe.Config{}, func(inbox *dedupe.Inbox, rc kafka.ReaderConfig) (*dedupekafka.Runner, error) {
		return dedupekafka.NewBatch(inbox, rc, cfg, h)
	})
}

// startWith runs the Runner build returns for an inbox with icfg over the
// bundle's schema (with the member's counting Observer and, by default, the
// test's logger).
func (b *bundle) startWith(t *testing.T, icfg dedupe.Config, build func(*dedupe.Inbox, kafka.ReaderConfig) (*dedupekafka.Runner, error), tune ...func(*kafka.ReaderConfig)) *member {
	t.Helper()
	rc := readerConfig(b.brokers, b.group, b.topic)
	for _, f := range tune {
		f(&rc)
	}
	obs := observetest.New()
	icfg.Observer = obs
	if icfg.Logger == nil {
		icfg.Logger = b.log.logger
	}
	inbox, err := dedupe.New(b.db.Pool, icfg)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := build(inbox, rc)
	if err != nil {
		t.Fatalf("new runner: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{runner: runner, obs: obs, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- runner.Run(ctx) }()
	t.Cleanup(func() { m.stop(t) })
	return m
}

// stop cancels the member and waits for Run; it returns Run's error.
func (m *member) stop(t testing.TB) error {
	t.Helper()
	if !m.once.CompareAndSwap(false, true) {
		return nil
	}
	m.cancel()
	select {
	case err := <-m.done:
		return err
	case <-time.After(30 * time.Second):
		t.Errorf("runner did not stop within 30s")
		return nil
	}
}

// waitDrained waits until the group committed every message of the topic.
func (b *bundle) waitDrained(t testing.TB, d time.Duration) {
	t.Helper()
	var last int
	var lastErr error
	dbtest.WaitFor(t, d, "the group to commit every offset", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		last, lastErr = groupLag(ctx, b.brokers, b.group, b.topic)
		return lastErr == nil && last == 0
	})
}

// insertEffects is insertEffect for a whole batch, in one statement.
func insertEffects(ctx context.Context, tx pgx.Tx, ms []kafka.Message) error {
	ids, parts, offs, bodies := make([]string, len(ms)), make([]int32, len(ms)), make([]int64, len(ms)), make([][]byte, len(ms))
	for n, m := range ms {
		ids[n] = dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...)
		parts[n], offs[n], bodies[n] = int32(m.Partition), m.Offset, m.Value
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, part, off, body)
		SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bytea[])`, ids, parts, offs, bodies)
	return err
}

// topicSize is the number of messages in topic (the sum of its partitions'
// end offsets), read from the broker.
func topicSize(t testing.TB, brokers []string, topic string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 5 * time.Second}
	meta, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	var reqs []kafka.OffsetRequest
	for _, p := range meta.Topics[0].Partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p.ID))
	}
	lo, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatalf("list offsets of %s: %v", topic, err)
	}
	n := 0
	for _, p := range lo.Topics[topic] {
		n += int(p.LastOffset)
	}
	return n
}

// deleteRecordsBefore moves the start of a partition's log to offset, as
// retention does (kafka-go has no DeleteRecords, so this speaks franz-go).
func deleteRecordsBefore(t testing.TB, brokers []string, topic string, partition int32, offset int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = partition, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("delete records: error code %d", code)
	}
}
