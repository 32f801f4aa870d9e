package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/kafkatest"
)

// TestTraceThroughKafka: enqueue → Kafka (the outbox publisher sends the
// message's headers as record headers) → the Kafka runner, one trace per
// order.
func TestTraceThroughKafka(t *testing.T) {
	t.Parallel()
	endToEnd(t, func(t *testing.T) *transport {
		brokers := kafkatest.ClusterWith(t, 2, []string{"orders"}, []kfake.Opt{kfake.GroupMinSessionTimeout(100 * time.Millisecond)})
		w := dedupekafka.NewOutboxWriter(brokers...)
		w.Transport = &kafka.Transport{}
		t.Cleanup(func() { _ = w.Close(); w.Transport.(*kafka.Transport).CloseIdleConnections() })
		pub, err := dedupekafka.NewOutboxPublisher(w, dedupekafka.OutboxPublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu   sync.Mutex
			seen = map[string]kafka.Message{} // by order, as it arrived
		)
		return &transport{
			system: "kafka", destination: "orders", group: "billing", publisher: pub,
			start: func(t *testing.T, inbox *dedupe.Inbox, effect effectFunc) func() {
				r, err := dedupekafka.New(inbox, readerConfig(brokers, "billing", "orders"), dedupekafka.Config{Logger: dbtest.Logger(t)},
					func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
						id := dedupekafka.KeyFromHeaders(m, orderHdr)
						mu.Lock()
						if _, ok := seen[id]; !ok {
							seen[id] = m
						}
						mu.Unlock()
						return effect(ctx, tx, id)
					})
				if err != nil {
					t.Fatal(err)
				}
				return dbtest.Background(t, "kafka runner", r.Run)
			},
			resend: func(t *testing.T, id string) {
				mu.Lock()
				m := seen[id]
				mu.Unlock()
				rw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "orders", Balancer: &kafka.Hash{},
					BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll, Transport: &kafka.Transport{}}
				defer func() { _ = rw.Close(); rw.Transport.(*kafka.Transport).CloseIdleConnections() }()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := rw.WriteMessages(ctx, kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers}); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}

// readerConfig is a group reader configuration tuned for fast joins on
// loopback.
func readerConfig(brokers []string, group, topic string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers: brokers, GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
		MaxWait:           500 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond,
		RebalanceTimeout: 1500 * time.Millisecond, JoinGroupBackoff: 100 * time.Millisecond,
		ReadBackoffMin: 10 * time.Millisecond, ReadBackoffMax: 100 * time.Millisecond,
		QueueCapacity: 1000, MaxBytes: 4 << 20,
	}
}
