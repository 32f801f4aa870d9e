package dedupe_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) {
	if url := os.Getenv("DEDUPE_HELPER_URL"); url != "" {
		// A subprocess of TestHandleAcrossProcesses, not a test run.
		keys, _ := strconv.Atoi(os.Getenv("DEDUPE_HELPER_KEYS"))
		if err := consumerHelperProcess(url, keys); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	dbtest.VerifyTestMain(m)
}

// bundle is what setup gives each test.
type bundle struct {
	db    *dbtest.DB
	inbox *dedupe.Inbox
	clock *dbtest.Clock
}

// setup migrates a fresh schema, creates an effects table and returns an
// inbox on it whose clock the test controls.
func setup(t *testing.T, cfg ...dedupe.Config) *bundle {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 16})
	clock := dbtest.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	var c dedupe.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	if c.Clock == nil {
		c.Clock = clock.Now
	}
	if c.Logger == nil {
		c.Logger = dbtest.Logger(t)
	}
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{Schema: c.Schema, InboxTable: c.Table}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_key text NOT NULL, note text)`)
	inbox, err := dedupe.New(db.Pool, c)
	if err != nil {
		t.Fatalf("new inbox: %v", err)
	}
	return &bundle{db: db, inbox: inbox, clock: clock}
}

func (b *bundle) effects(t *testing.T, key string) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM effects WHERE msg_key = $1", key)
}

// together runs f in n goroutines released at the same instant and waits.
func together(n int, f func(i int)) { dbtest.Together(n, f) }
