package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
)

// The soak's Kafka names.
const (
	kafkaTopic      = "soak-orders"
	kafkaDLQ        = "soak-orders-dlq"
	kafkaGroup      = "soak"
	kafkaPartitions = 4
)

// runKafka soaks the kafka-go runner (per-message mode, or batch mode for
// the kafka-batch transport) on an in-process Kafka-protocol broker (kfake):
// every input published with its id in the Idempotency-Key header and a
// message key that spreads duplicates over partitions, two in-process group
// members (one stopped and restarted at random, so its uncommitted offsets
// are redelivered after the rebalance) and a worker subprocess in the same
// group that is killed mid-transaction.
func runKafka(batch int) func(ctx context.Context, e *env, inputs []string) error {
	return func(ctx context.Context, e *env, inputs []string) error {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkaPartitions, kafkaTopic, kafkaDLQ),
			kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			return err
		}
		defer cluster.Close()
		brokers := cluster.ListenAddrs()
		pool, inbox, err := e.consumerInbox(ctx, int32(kafkaPartitions)*2+1)
		if err != nil {
			return err
		}
		defer pool.Close()
		var (
			seenMu sync.Mutex
			seen   = map[[2]int64]bool{}
		)
		handler := faultyHandler(e, func(m kafka.Message) {
			// A redelivery: an offset whose handler already succeeded once.
			k := [2]int64{int64(m.Partition), m.Offset}
			seenMu.Lock()
			again := seen[k]
			seenMu.Unlock()
			if again {
				e.faults.add(faultRedeliver)
			}
		})
		succeeded := func(m kafka.Message) {
			seenMu.Lock()
			seen[[2]int64{int64(m.Partition), m.Offset}] = true
			seenMu.Unlock()
		}
		tr := &kafka.Transport{}
		defer tr.CloseIdleConnections()
		dlq := kafkaDLQWriter(brokers, tr)
		defer dlq.Close()
		defer func() {
			// Read the dead letters even after a failed run, for the audit.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			dl, err := kafkaDeadLetters(rctx, tr, brokers)
			if err != nil {
				e.soak.log.Error("soak: read the Kafka dead letters", "err", err)
			}
			e.deadLettered = dl
		}()
		return runExternal(ctx, e, external{
			consumers: 2,
			consume: func(ctx context.Context, _ int) error {
				return runKafkaMember(ctx, inbox, brokers, e.scope, batch, dlq, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
					err := handler(ctx, tx, m)
					if err == nil {
						succeeded(m)
					}
					return err
				})
			},
			childArgs: []string{"-kafka-brokers", strings.Join(brokers, ","), "-kafka-batch", strconv.Itoa(batch)},
			feed: func(ctx context.Context) error {
				w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: kafkaTopic, Balancer: &kafka.Hash{},
					BatchSize: 500, BatchTimeout: 5 * time.Millisecond, RequiredAcks: kafka.RequireAll, Transport: tr}
				defer w.Close()
				msgs := make([]kafka.Message, 0, 500)
				for i, id := range inputs {
					m := kafka.Message{Key: []byte(strconv.Itoa(i)), Value: []byte(id)}
					if !e.withoutKey(id) {
						m.Headers = []kafka.Header{{Key: "Idempotency-Key", Value: []byte(id)}}
					}
					msgs = append(msgs, m)
					if len(msgs) == cap(msgs) || i == len(inputs)-1 {
						if err := w.WriteMessages(ctx, msgs...); err != nil {
							if ctx.Err() != nil {
								return nil
							}
							return fmt.Errorf("publish: %w", err)
						}
						msgs = msgs[:0]
					}
				}
				return nil
			},
			done: func(ctx context.Context) (bool, error) {
				lag, produced, err := kafkaLag(ctx, tr, brokers)
				if err != nil || lag > 0 || produced < int64(len(inputs)) {
					return false, err
				}
				return e.settledInDB(ctx)
			},
		})
	}
}

// runKafkaMember runs one group member, dead-lettering to dlq, until ctx
// ends.
func runKafkaMember(ctx context.Context, inbox *dedupe.Inbox, brokers []string, scope string, batch int,
	dlq *kafka.Writer, h dedupekafka.HandlerFunc) error {
	rc := kafka.ReaderConfig{
		Brokers:           brokers,
		GroupID:           kafkaGroup,
		Topic:             kafkaTopic,
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
	r, err := dedupekafka.New(inbox, rc, dedupekafka.Config{
		Scope:           scope,
		BatchSize:       batch,
		RetryBackoff:    10 * time.Millisecond,
		MaxRetryBackoff: 50 * time.Millisecond,
		DeadLetter:      dlq,
	}, h)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// kafkaChild is the Kafka worker subprocess: one more member of the group.
func kafkaChild(ctx context.Context, e *env, fl *childFlags, say func(verb, arg string)) error {
	pool, inbox, err := e.consumerInbox(ctx, kafkaPartitions+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	brokers := strings.Split(fl.kafkaBrokers, ",")
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	dlq := kafkaDLQWriter(brokers, tr)
	defer dlq.Close()
	return runKafkaMember(ctx, inbox, brokers, e.scope, fl.kafkaBatch, dlq, childHandler[kafka.Message](e, say))
}

// kafkaDLQWriter writes the runners' dead letters, synchronously and durably
// as the runner requires.
func kafkaDLQWriter(brokers []string, tr *kafka.Transport) *kafka.Writer {
	return &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: kafkaDLQ, Balancer: &kafka.Hash{},
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll, Transport: tr}
}

// kafkaDeadLetters returns the inputs with a copy in the dead-letter topic
// (the copy's value is the input's id).
func kafkaDeadLetters(ctx context.Context, tr *kafka.Transport, brokers []string) (map[string]bool, error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 5 * time.Second}
	reqs := make([]kafka.OffsetRequest, kafkaPartitions)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	lo, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{kafkaDLQ: reqs}})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range lo.Topics[kafkaDLQ] {
		if p.Error != nil {
			return out, p.Error
		}
		if p.LastOffset <= 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: kafkaDLQ, Partition: p.Partition,
			MaxWait: 500 * time.Millisecond, Dialer: &kafka.Dialer{Timeout: 5 * time.Second}})
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				_ = r.Close()
				return out, err
			}
			out[string(m.Value)] = true
			if m.Offset+1 >= p.LastOffset {
				break
			}
		}
		if err := r.Close(); err != nil {
			return out, err
		}
	}
	return out, nil
}

// kafkaLag returns how many produced messages the group has not committed,
// and how many were produced.
func kafkaLag(ctx context.Context, tr *kafka.Transport, brokers []string) (lag, produced int64, err error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 5 * time.Second}
	parts := make([]int, kafkaPartitions)
	reqs := make([]kafka.OffsetRequest, kafkaPartitions)
	for p := range parts {
		parts[p] = p
		reqs[p] = kafka.LastOffsetOf(p)
	}
	lo, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{kafkaTopic: reqs}})
	if err != nil {
		return 0, 0, err
	}
	of, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: kafkaGroup, Topics: map[string][]int{kafkaTopic: parts}})
	if err != nil {
		return 0, 0, err
	}
	if of.Error != nil {
		return 0, 0, of.Error
	}
	committed := map[int]int64{}
	for _, p := range of.Topics[kafkaTopic] {
		if p.Error != nil {
			return 0, 0, p.Error
		}
		committed[p.Partition] = max(p.CommittedOffset, 0)
	}
	for _, p := range lo.Topics[kafkaTopic] {
		if p.Error != nil {
			return 0, 0, p.Error
		}
		produced += p.LastOffset
		lag += p.LastOffset - committed[p.Partition]
	}
	return lag, produced, nil
}
