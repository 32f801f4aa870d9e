package test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/natstest"
)

// TestTraceThroughNATS: enqueue → JetStream (the outbox publisher sends the
// message's headers as NATS headers) → the NATS runner, one trace per
// order.
func TestTraceThroughNATS(t *testing.T) {
	t.Parallel()
	endToEnd(t, func(t *testing.T) *transport {
		ctx := context.Background()
		srv := natstest.Server(t)
		nc := natstest.Connect(t, srv)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
			t.Fatal(err)
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
			Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu   sync.Mutex
			seen = map[string]nats.Header{} // by order, the headers it arrived with
		)
		return &transport{
			system: "nats", destination: "orders.created", group: "billing", publisher: pub,
			start: func(t *testing.T, inbox *dedupe.Inbox, effect effectFunc) func() {
				r, err := dedupenats.New(inbox, cons, dedupenats.Config{Key: dedupenats.HeaderKey(orderHdr), Logger: dbtest.Logger(t)}, func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error {
					id := m.Headers().Get(orderHdr)
					mu.Lock()
					if seen[id] == nil {
						seen[id] = m.Headers()
					}
					mu.Unlock()
					return effect(ctx, tx, id)
				})
				if err != nil {
					t.Fatal(err)
				}
				return dbtest.Background(t, "nats runner", r.Run)
			},
			resend: func(t *testing.T, id string) {
				mu.Lock()
				h := seen[id]
				mu.Unlock()
				m := nats.NewMsg("orders.created")
				for k, vs := range h {
					m.Header[k] = append([]string(nil), vs...)
				}
				m.Header.Set(jetstream.MsgIDHeader, nuid.Next())
				if _, err := js.PublishMsg(context.Background(), m); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
