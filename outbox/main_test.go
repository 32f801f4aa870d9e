package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/outbox"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

func exampleDB() (*pgxpool.Pool, func()) { return dbtest.ForExample() }

// bundle is what setup gives each test: a fresh, migrated schema and a
// clock the test controls.
type bundle struct {
	db    *dbtest.DB
	clock *dbtest.Clock
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 16})
	clock := dbtest.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &bundle{db: db, clock: clock}
}

// relayHooks is an Observer for the relay tests: funcs called for the
// outbox's backlog, each confirmed publish (with its lag) and each failed one.
type relayHooks struct {
	outbox.NopObserver
	Queued    func(outbox.Stats)
	Published func(*outbox.StoredMessage, time.Duration)
	Failed    func(*outbox.StoredMessage, error, bool)
}

func (h relayHooks) OutboxQueued(_ context.Context, s outbox.Stats) {
	if h.Queued != nil {
		h.Queued(s)
	}
}

func (h relayHooks) StartPublish(ctx context.Context, m *outbox.StoredMessage) (context.Context, func(outbox.PublishDone)) {
	return ctx, func(d outbox.PublishDone) {
		switch {
		case d.Err == nil && h.Published != nil:
			h.Published(m, d.Lag)
		case d.Err != nil && h.Failed != nil:
			h.Failed(m, d.Err, d.Parked)
		}
	}
}

func together(n int, f func(i int)) { dbtest.Together(n, f) }
