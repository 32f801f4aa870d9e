package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/outbox"
)

// bothObserver implements dedupe.Observer and outbox.Observer, as
// dedupeotel's does, and counts enqueues.
type bothObserver struct {
	dedupe.NopObserver
	enqueued int
}

func (o *bothObserver) Enqueued(context.Context, *outbox.Message) { o.enqueued++ }

func (o *bothObserver) StartPublish(ctx context.Context, _ *outbox.StoredMessage) (context.Context, func(outbox.PublishDone)) {
	return ctx, func(outbox.PublishDone) {}
}

func (o *bothObserver) Discarded(context.Context, *outbox.StoredMessage, string, string) {}

func (o *bothObserver) OutboxQueued(context.Context, outbox.Stats) {}

// TestNewForSharesTheInboxSettings: an outbox built with NewFor takes the
// inbox's DB, Schema, Clock, Logger and (when it implements outbox.Observer)
// Observer; a field set in its own Config wins.
func TestNewForSharesTheInboxSettings(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// A schema of the inbox's and outbox's own, beside the test's.
	shared := db.Schema + "_shared"
	db.Exec(t, `CREATE SCHEMA `+pgx.Identifier{shared}.Sanitize())
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{shared}.Sanitize()+` CASCADE`)
	})
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{Schema: shared}); err != nil {
		t.Fatal(err)
	}
	clock := dbtest.NewClock(time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC))
	logger := slog.New(slog.DiscardHandler)
	obs := &bothObserver{}
	inbox, err := dedupe.New(db.Pool, dedupe.Config{Schema: shared, Clock: clock.Now, Logger: logger, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.NewFor(inbox, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := ob.Config()
	if c.Schema != shared || c.Logger != logger || c.Clock == nil || c.Observer != outbox.Observer(obs) {
		t.Fatalf("config = %+v, want the inbox's schema, clock, logger and observer", c)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "t"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if obs.enqueued != 1 {
		t.Fatalf("the inbox's observer saw %d enqueues, want 1", obs.enqueued)
	}
	var created time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT created_at FROM `+pgx.Identifier{shared, "dedupe_outbox"}.Sanitize()).Scan(&created); err != nil {
		t.Fatal(err)
	}
	if !created.Equal(clock.Now()) {
		t.Fatalf("created_at = %v, want the inbox's clock %v", created, clock.Now())
	}

	own := slog.New(slog.DiscardHandler)
	ob, err = outbox.NewFor(inbox, outbox.Config{Schema: db.Schema, Logger: own, Observer: outbox.NopObserver{}})
	if err != nil {
		t.Fatal(err)
	}
	if c := ob.Config(); c.Schema != db.Schema || c.Logger != own || c.Observer != outbox.Observer(outbox.NopObserver{}) {
		t.Fatalf("config = %+v, want its own schema, logger and observer", c)
	}
	if _, err := outbox.NewFor(nil, outbox.Config{}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("NewFor(nil) = %v, want ErrInvalidConfig", err)
	}
}
