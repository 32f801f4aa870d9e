package test

import (
	"context"
	"maps"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/internal/amqptest"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestTraceThroughRabbitMQ: enqueue → RabbitMQ (the outbox publisher sends
// the message's headers as AMQP headers, with confirms) → the RabbitMQ
// runner, one trace per order, messaging.system rabbitmq and the queue as
// the destination.
func TestTraceThroughRabbitMQ(t *testing.T) {
	t.Parallel()
	endToEnd(t, func(t *testing.T) *transport {
		conn := amqptest.Dial(t)
		queue := amqptest.Name(t, "orders")
		amqptest.Queue(t, conn, queue, nil)
		pub, err := dedupeamqp.NewOutboxPublisher(amqptest.URL(), dedupeamqp.OutboxPublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu   sync.Mutex
			seen = map[string]amqp.Table{} // by order, the headers it arrived with
		)
		return &transport{
			system: "rabbitmq", destination: queue, group: queue, publisher: pub,
			start: func(t *testing.T, inbox *dedupe.Inbox, effect effectFunc) func() {
				r, err := dedupeamqp.New(inbox, amqptest.URL(), queue, dedupeamqp.Config{Key: dedupeamqp.HeaderKey(orderHdr), Logger: dbtest.Logger(t)},
					func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
						id, _ := d.Headers[orderHdr].(string)
						mu.Lock()
						if seen[id] == nil {
							seen[id] = maps.Clone(d.Headers)
						}
						mu.Unlock()
						return effect(ctx, tx, id)
					})
				if err != nil {
					t.Fatal(err)
				}
				return dbtest.Background(t, "rabbitmq runner", r.Run)
			},
			resend: func(t *testing.T, id string) {
				mu.Lock()
				h := maps.Clone(seen[id])
				mu.Unlock()
				if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{
					Headers: h, MessageId: "resent-" + id,
				}); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
