package main

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
)

const (
	benchTopic = "bench"
	benchGroup = "bench"
)

// kafkaTopic starts a kfake cluster whose topic has one partition per
// worker (Kafka's unit of parallelism) and publishes the row's messages.
func (b *bench) kafkaTopic(ctx context.Context, partitions int) (brokers []string, cleanup func(), err error) {
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
	n := b.opts.transportMsgs
	for i := range n {
		id := b.run + "-" + strconv.Itoa(i)
		msgs = append(msgs, kafka.Message{Value: []byte(body), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(id)}}})
		if len(msgs) == cap(msgs) || i == n-1 {
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				c.Close()
				return nil, nil, err
			}
			msgs = msgs[:0]
		}
	}
	return brokers, c.Close, nil
}

// kafkaRow starts the row's cluster with its messages (kafkaTopic) and a
// timed reader of the bench group on it; cleanup closes both.
func (b *bench) kafkaRow(ctx context.Context, partitions int) (r *timedReader, cleanup func(), err error) {
	brokers, stopCluster, err := b.kafkaTopic(ctx, partitions)
	if err != nil {
		return nil, nil, err
	}
	r = &timedReader{Reader: newBenchReader(brokers), fetched: map[[2]int64]time.Time{}}
	return r, func() { _ = r.Close(); stopCluster() }, nil
}

func newBenchReader(brokers []string) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{
		Brokers: brokers, GroupID: benchGroup, Topic: benchTopic, StartOffset: kafka.FirstOffset,
		MaxWait: 20 * time.Millisecond, ReadBatchTimeout: 20 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond,
		RebalanceTimeout: 1500 * time.Millisecond, JoinGroupBackoff: 50 * time.Millisecond,
		QueueCapacity: 1000, MaxBytes: 4 << 20,
	})
}

// timedReader records, per message, the time from its fetch to the commit
// of its offset: the latency both Kafka consumers are measured by.
type timedReader struct {
	*kafka.Reader
	mu      sync.Mutex
	fetched map[[2]int64]time.Time
	lat     latencies
}

func (r *timedReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	m, err := r.Reader.FetchMessage(ctx)
	if err == nil {
		r.mu.Lock()
		r.fetched[[2]int64{int64(m.Partition), m.Offset}] = time.Now()
		r.mu.Unlock()
	}
	return m, err
}

func (r *timedReader) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	err := r.Reader.CommitMessages(ctx, msgs...)
	if err == nil {
		now := time.Now()
		r.mu.Lock()
		for _, m := range msgs {
			k := [2]int64{int64(m.Partition), m.Offset}
			if t, ok := r.fetched[k]; ok {
				r.lat.add(now.Sub(t))
				delete(r.fetched, k)
			}
		}
		r.mu.Unlock()
	}
	return err
}

// kafkaHand is the hand-written kafka-go consumer: FetchMessage, one worker
// per partition running claim + effect in a transaction, then
// CommitMessages.
func (b *bench) kafkaHand(ctx context.Context, _ jetstream.JetStream, _, w int) (*result, error) {
	r, cleanup, err := b.kafkaRow(ctx, w)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	n := b.opts.transportMsgs
	start := time.Now()
	rctx, stop := context.WithCancel(ctx)
	parts := make([]chan kafka.Message, w)
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	for p := range parts {
		parts[p] = make(chan kafka.Message, 64)
		wg.Go(func() {
			for m := range parts[p] {
				id := dedupekafka.KeyFromHeaders(m, "Idempotency-Key")
				if err := b.handClaimEffectTx(rctx, "kafka-hand", id); err != nil {
					if rctx.Err() == nil {
						errOnce.Do(func() { firstErr = err })
					}
					continue
				}
				_ = r.CommitMessages(rctx, m)
			}
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
			parts[m.Partition%w] <- m
		}
	})
	err = b.waitEffects(ctx, n)
	elapsed := time.Since(start)
	stop()
	wg.Wait()
	if err == nil {
		err = firstErr
	}
	if err != nil {
		return nil, err
	}
	return drained("", "", "fetch→commit", w, n, elapsed, &r.lat), nil
}

// kafkaRunner drains the same messages with dedupekafka.Runner.
func (b *bench) kafkaRunner(ctx context.Context, _ jetstream.JetStream, _, w int) (*result, error) {
	r, cleanup, err := b.kafkaRow(ctx, w)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	n := b.opts.transportMsgs
	start := time.Now()
	run, err := dedupekafka.New(b.inbox, r, dedupekafka.Config{Scope: "kafka-runner"},
		func(ctx context.Context, tx pgx.Tx, _ kafka.Message) error {
			_, err := tx.Exec(ctx, sqlEffect, dedupe.ClaimFromContext(ctx).Key.ID, body)
			return err
		})
	if err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run.Run(rctx) }()
	err = b.waitEffects(ctx, n)
	elapsed := time.Since(start)
	stop()
	if rerr := <-done; err == nil && rerr != nil && !errors.Is(rerr, context.Canceled) {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	return drained("", "", "fetch→commit", w, n, elapsed, &r.lat), nil
}
