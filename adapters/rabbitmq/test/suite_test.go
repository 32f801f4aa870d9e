package test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/internal/adaptertest"
	"github.com/exactlyonce/dedupe/internal/amqptest"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestSuite runs the shared transport suite over a queue of its own for
// each test. The suite's id travels as the Order-Id header, the runner's
// business key, with a fresh message_id per publish.
func TestSuite(t *testing.T) {
	adaptertest.Run(t, adaptertest.Transport{
		Name:     "rabbitmq",
		Features: adaptertest.Features{Poison: true},
		New: func(t *testing.T, db *dbtest.DB) adaptertest.Instance {
			b := setup(t, setupOpts{db: db})
			return adaptertest.Instance{
				Publish: func(ctx context.Context, id string, body []byte) error {
					b.publish(t, id, string(body))
					return nil
				},
				Start:    start[pgx.Tx](t, b),
				StartSQL: start[*sql.Tx](t, b),
				// Ready messages only: the suite asks once its consumers
				// stopped, when the broker has requeued what they held.
				Unacked: func(ctx context.Context) (int, error) {
					return amqptest.Count(t, b.conn, b.queue), nil
				},
			}
		},
	})
}

// start runs a Runner on b's queue whose handler, of the inbox driver's
// transaction type TTx, runs the suite's effect.
func start[TTx any](t *testing.T, b *bundle) func(ctx context.Context, inbox *dedupe.Inbox, rc adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
	return func(ctx context.Context, inbox *dedupe.Inbox, rc adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
		r, err := dedupeamqp.New(inbox, amqptest.URL(), b.queue, dedupeamqp.Config{
			Key:         dedupeamqp.HeaderKey(orderIDHdr),
			Workers:     rc.Workers,
			MaxAttempts: rc.MaxAttempts,
			Backoff:     func(int) time.Duration { return 20 * time.Millisecond },
			Logger:      testLogger(t),
		}, func(ctx context.Context, tx TTx, d amqp.Delivery) error {
			return effect(ctx, tx, dedupe.ClaimFromContext(ctx).Key.ID, d.Body)
		})
		if err != nil {
			t.Fatalf("new runner: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		return func() error { return <-done }
	}
}
