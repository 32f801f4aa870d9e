package test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/adaptertest"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestSuite runs the shared transport suite. JetStream drops a re-published
// Nats-Msg-Id inside the stream's duplicate window, so the suite's
// duplicates are published with fresh Nats-Msg-Ids and the suite's id as a
// business-key header, which the runner's key function reads.
func TestSuite(t *testing.T) { runSuite(t, "nats-jetstream", 1) }

// TestSuiteBatch runs the shared transport suite over the runner's batch
// mode (Config.BatchSize).
func TestSuiteBatch(t *testing.T) { runSuite(t, "nats-jetstream-batch", 10) }

func runSuite(t *testing.T, name string, batchSize int) {
	adaptertest.Run(t, adaptertest.Transport{
		Name:     name,
		Features: adaptertest.Features{Poison: true},
		New: func(t *testing.T, db *dbtest.DB) adaptertest.Instance {
			b := setup(t, setupOpts{db: db})
			return adaptertest.Instance{
				Publish: func(ctx context.Context, id string, body []byte) error {
					b.publish(t, id, string(body))
					return nil
				},
				Start:    start[pgx.Tx](t, b, batchSize),
				StartSQL: start[*sql.Tx](t, b, batchSize),
				Unacked: func(ctx context.Context) (int, error) {
					ci, err := b.cons.Info(ctx)
					if err != nil {
						return 0, err
					}
					return ci.NumAckPending + int(ci.NumPending), nil
				},
			}
		},
	})
}

// start runs a Runner on b's consumer whose handler, of the inbox driver's
// transaction type TTx, runs the suite's effect, batchSize messages per
// transaction.
func start[TTx any](t *testing.T, b *bundle, batchSize int) func(ctx context.Context, inbox *dedupe.Inbox, rc adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
	return func(ctx context.Context, inbox *dedupe.Inbox, rc adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
		r, err := dedupenats.New(inbox, b.cons, dedupenats.Config{
			Key:         dedupenats.HeaderKey(orderIDHdr),
			Workers:     rc.Workers,
			BatchSize:   batchSize,
			MaxAttempts: rc.MaxAttempts,
			Backoff:     func(int) time.Duration { return 20 * time.Millisecond },
			PullExpiry:  500 * time.Millisecond,
		}, func(ctx context.Context, tx TTx, msg jetstream.Msg) error {
			return effect(ctx, tx, dedupe.ClaimFromContext(ctx).Key.ID, msg.Data())
		})
		if err != nil {
			t.Fatalf("new runner: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		return func() error { return <-done }
	}
}
