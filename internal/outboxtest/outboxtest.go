// Package outboxtest holds the test setup the outbox publishers of the
// transport adapters share: a migrated schema with an outbox, and committed
// enqueues.
package outboxtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/outbox"
)

// New returns a fresh schema (dbtest.New), migrated, and an outbox in it.
func New(t testing.TB) (*dbtest.DB, *outbox.Outbox) {
	t.Helper()
	db := dbtest.New(t)
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("outboxtest: migrate: %v", err)
	}
	ob, err := outbox.New(db.Pool, outbox.Config{})
	if err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	return db, ob
}

// Enqueue enqueues msgs in ob in one transaction on db, commits it and
// returns the messages' IDs in order.
func Enqueue(t testing.TB, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, ob *outbox.Outbox, msgs ...outbox.Message) []string {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, 0, len(msgs))
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		for _, m := range msgs {
			id, err := ob.Enqueue(ctx, tx, m)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("outboxtest: enqueue: %v", err)
	}
	return ids
}

// FailedPublishes is an Observer that counts the relay's failed publishes.
type FailedPublishes struct {
	outbox.NopObserver
	n atomic.Int32
}

// StartPublish counts the publish if it fails.
func (f *FailedPublishes) StartPublish(ctx context.Context, _ *outbox.StoredMessage) (context.Context, func(outbox.PublishDone)) {
	return ctx, func(d outbox.PublishDone) {
		if d.Err != nil {
			f.n.Add(1)
		}
	}
}

// Load returns how many publishes failed.
func (f *FailedPublishes) Load() int32 { return f.n.Load() }
