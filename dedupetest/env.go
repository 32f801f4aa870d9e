package dedupetest

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// Options tune New. The zero value is usable.
type Options struct {
	// Config is the inbox's configuration. Defaults to dedupe.Config{}; its
	// Clock is set to the Env's Clock when UseClock is true.
	Config dedupe.Config
	// UseClock makes the inbox decide leases and expiries by Env.Clock
	// instead of the database's clock. Defaults to false.
	UseClock bool
	// MaxConns bounds the pool. Defaults to 8.
	MaxConns int32
	// Setup runs once on the new schema after the migration, for the
	// tables the handler writes. Defaults to none.
	Setup []string
}

// Env is a test's throwaway schema with a migrated inbox (and outbox).
type Env struct {
	// Pool connects to the schema.
	Pool *pgxpool.Pool
	// Inbox is an inbox over Pool with Options.Config.
	Inbox *dedupe.Inbox
	// Schema is the schema's name and URL a connection string that uses
	// it, for pools and subprocesses of the test's own.
	Schema, URL string
	// Clock is the inbox's clock when Options.UseClock is set.
	Clock *Clock

	cfg dedupe.Config
}

// New creates a schema for t on the test server, migrates the inbox and the
// outbox into it, runs Options.Setup, and drops the schema when the test
// ends. The test fails (never skips) when no server answers.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	base := ServerURL(t)
	name, u := schema(t, base)
	if opts.MaxConns == 0 {
		opts.MaxConns = 8
	}
	e := &Env{Pool: newPool(t, u, opts.MaxConns), Schema: name, URL: u,
		Clock: NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))}
	e.cfg = opts.Config
	if opts.UseClock {
		e.cfg.Clock = e.Clock.Now
	}
	ctx, cancel, _ := callContext(t)
	defer cancel()
	if err := dedupe.Migrate(ctx, e.Pool, dedupe.MigrateConfig{Schema: e.cfg.Schema, InboxTable: e.cfg.Table}); err != nil {
		t.Fatalf("dedupetest: migrate: %v", err)
	}
	for _, q := range opts.Setup {
		e.Exec(t, q)
	}
	inbox, err := dedupe.New(e.Pool, e.cfg)
	if err != nil {
		t.Fatalf("dedupetest: inbox: %v", err)
	}
	e.Inbox = inbox
	return e
}

// Config returns the inbox's configuration, for inboxes the test builds over
// other pools (see Faulty).
func (e *Env) Config() dedupe.Config { return e.cfg }

// Exec runs sql on the schema and fails the test on error.
func (e *Env) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel, _ := callContext(t)
	defer cancel()
	if _, err := e.Pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("dedupetest: %s: %v", sql, err)
	}
}

// Count runs a query returning one integer (a count of effects).
func (e *Env) Count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	ctx, cancel, _ := callContext(t)
	defer cancel()
	var n int
	if err := e.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("dedupetest: %s: %v", sql, err)
	}
	return n
}

// WantCount fails the test unless the query's count is want: "exactly one
// effect" is WantCount(t, 1, "SELECT count(*) FROM charges WHERE ...").
func (e *Env) WantCount(t testing.TB, want int, sql string, args ...any) {
	t.Helper()
	if got := e.Count(t, sql, args...); got != want {
		t.Fatalf("dedupetest: %s = %d, want %d", sql, got, want)
	}
}

// State returns the stored state of key, or "" when it is absent.
func (e *Env) State(t testing.TB, key dedupe.Key) dedupe.State {
	t.Helper()
	ctx, cancel, _ := callContext(t)
	defer cancel()
	rec, err := e.Inbox.Lookup(ctx, key)
	if err != nil {
		return ""
	}
	return rec.State
}
