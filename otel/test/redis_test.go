package test

import (
	"context"
	"maps"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/redistest"
)

// TestTraceThroughRedis: enqueue → a Redis stream (the outbox publisher
// writes the message's headers, the trace context among them, as fields)
// → the Redis Streams runner, one trace per order, messaging.system redis,
// the stream as the destination and the group as the consumer group.
func TestTraceThroughRedis(t *testing.T) {
	t.Parallel()
	endToEnd(t, func(t *testing.T) *transport {
		rdb := redistest.Client(t)
		stream := redistest.Stream(t, rdb, "orders")
		pub, err := deduperedis.NewOutboxPublisher(rdb, deduperedis.OutboxPublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu   sync.Mutex
			seen = map[string]map[string]any{} // by order, the fields it arrived with
		)
		return &transport{
			system: "redis", destination: stream, group: "billing", publisher: pub,
			start: func(t *testing.T, inbox *dedupe.Inbox, effect effectFunc) func() {
				r, err := deduperedis.New(inbox, rdb, stream, "billing", deduperedis.Config{
					Key: deduperedis.FieldKey(orderHdr), Logger: dbtest.Logger(t),
				}, func(ctx context.Context, tx pgx.Tx, m *deduperedis.Message) error {
					id := m.Field(orderHdr)
					mu.Lock()
					if seen[id] == nil {
						seen[id] = maps.Clone(m.Values)
					}
					mu.Unlock()
					return effect(ctx, tx, id)
				})
				if err != nil {
					t.Fatal(err)
				}
				return dbtest.Background(t, "redis runner", r.Run)
			},
			resend: func(t *testing.T, id string) {
				mu.Lock()
				values := maps.Clone(seen[id])
				mu.Unlock()
				if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: values}).Err(); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
