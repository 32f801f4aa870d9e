package main

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
)

const (
	benchTopic = "bench"
	benchGroup = "bench"
	// kafkaQueue is every Kafka consumer's read-ahead: the queue of the
	// runner's partition readers, and both the group reader's queue and each
	// partition's channel in the hand-written consumer.
	kafkaQueue = 1000
	// kafkaCommitInterval is how often both consumers commit offsets (the
	// runner's default): the hand-written one through the reader's
	// CommitInterval, as a careful engineer would have it.
	kafkaCommitInterval = time.Second
)

// kafkaTopic empties the run's effects (reset), starts a kfake cluster
// whose topic has one partition per worker (Kafka's unit of parallelism)
// and publishes the run's backlog.
func (b *bench) kafkaTopic(ctx context.Context, partitions int, backlog int64) (brokers []string, cleanup func(), err error) {
	if err := b.reset(ctx, b.run); err != nil {
		return nil, nil, err
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), benchTopic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return nil, nil, err
	}
	brokers = c.ListenAddrs()
	tr := &kafka.Transport{}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: benchTopic, Balancer: &kafka.RoundRobin{},
		BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll, Transport: tr}
	defer func() { _ = w.Close(); tr.CloseIdleConnections() }()
	msgs := make([]kafka.Message, 0, 1000)
	for i := range backlog {
		id := b.run + "-" + strconv.FormatInt(i, 10)
		msgs = append(msgs, kafka.Message{Value: []byte(body), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(id)}}})
		if len(msgs) == cap(msgs) || i == backlog-1 {
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				c.Close()
				return nil, nil, err
			}
			msgs = msgs[:0]
		}
	}
	return brokers, c.Close, nil
}

// benchReaderConfig is the group reader configuration of both Kafka
// consumers.
func benchReaderConfig(brokers []string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers: brokers, GroupID: benchGroup, Topic: benchTopic, StartOffset: kafka.FirstOffset,
		MaxWait:           500 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond,
		RebalanceTimeout: 1500 * time.Millisecond, JoinGroupBackoff: 50 * time.Millisecond,
		QueueCapacity: kafkaQueue, MaxBytes: 4 << 20,
	}
}

// kafkaHand is the hand-written kafka-go consumer: a group Reader
// committing offsets every kafkaCommitInterval, one fetch loop dispatching
// to a worker per partition (a channel of kafkaQueue messages each), each
// running the hand-written claim + effect transaction and then
// CommitMessages (which queues the offset). Latency: the transaction.
func (b *bench) kafkaHand(ctx context.Context, partitions int, sp span) (*sample, error) {
	return b.kafkaHandCommitting(ctx, partitions, sp, kafkaCommitInterval)
}

// kafkaHandPerMessage is kafkaHand committing each message's offset to the
// broker before the next (CommitInterval 0: CommitMessages waits for the
// commit), the way a consumer that wants no redeliveries is often written:
// the baseline issue 16 measures the runner against, next to the async one.
func (b *bench) kafkaHandPerMessage(ctx context.Context, partitions int, sp span) (*sample, error) {
	return b.kafkaHandCommitting(ctx, partitions, sp, 0)
}

// kafkaHandCommitting is the hand-written consumer with the reader's
// CommitInterval set to every (0: synchronous commits).
func (b *bench) kafkaHandCommitting(ctx context.Context, partitions int, sp span, every time.Duration) (*sample, error) {
	brokers, stopCluster, err := b.kafkaTopic(ctx, partitions, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer stopCluster()
	rc := benchReaderConfig(brokers)
	rc.CommitInterval = every
	r := kafka.NewReader(rc)
	defer r.Close()
	win := newWindow(sp)
	return b.drainRow(ctx, win, func(rctx context.Context) (func() error, error) {
		parts := make([]chan kafka.Message, partitions)
		var wg sync.WaitGroup
		for p := range parts {
			parts[p] = make(chan kafka.Message, kafkaQueue)
			wg.Go(func() {
				handConsume(rctx, b, win, parts[p],
					func(m kafka.Message) string { return dedupekafka.KeyFromHeaders(m, "Idempotency-Key") },
					func(m kafka.Message) error { return r.CommitMessages(rctx, m) },
					nil)
			})
		}
		wg.Go(func() {
			defer func() {
				for _, c := range parts {
					close(c)
				}
			}()
			for {
				m, err := r.FetchMessage(rctx)
				if err != nil {
					return
				}
				select {
				case parts[m.Partition%partitions] <- m:
				case <-rctx.Done():
					return
				}
			}
		})
		return func() error { wg.Wait(); return nil }, nil
	})
}

// kafkaRunner drains the same backlog with dedupekafka.Runner in
// per-message mode (runnerRow).
func (b *bench) kafkaRunner(ctx context.Context, partitions int, sp span) (*sample, error) {
	brokers, stopCluster, err := b.kafkaTopic(ctx, partitions, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer stopCluster()
	return b.runnerRow(ctx, sp, func(inbox *dedupe.Inbox) (runner, error) {
		return dedupekafka.New(inbox, benchReaderConfig(brokers), dedupekafka.Config{Scope: benchScope, CommitInterval: kafkaCommitInterval},
			effect[kafka.Message])
	})
}
