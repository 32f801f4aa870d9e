package dedupe_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgerr"
)

// TestMigrateUpgradesPopulatedInbox: migration inbox/002 (the checks of
// scope, key and state move into domains) upgrades an inbox of 001 that holds
// keys in place: the keys stay, the checks still refuse bad rows, Handle
// tells the old keys' duplicates from new keys, and Purge deletes what
// expired. Its down migration gives back 001's table with its checks.
func TestMigrateUpgradesPopulatedInbox(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	m, err := dedupe.NewMigrator(db.Pool, dedupe.MigrateConfig{Lines: []dedupe.Line{dedupe.LineInbox}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if reverted, err := m.Down(ctx, 1); err != nil || len(reverted) != 1 || reverted[0].Version != 2 {
		t.Fatalf("down to 001 = %+v, %v", reverted, err)
	}
	checks := func() int {
		return db.Count(t, "SELECT count(*) FROM pg_constraint WHERE conrelid = 'dedupe_inbox'::regclass AND contype = 'c'")
	}
	if n := checks(); n != 3 {
		t.Fatalf("001's table has %d checks, want 3", n)
	}

	inbox, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var effects []string
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{
		Scope: "s", Key: func(m string) (string, error) { return m, nil },
	}, func(ctx context.Context, tx pgx.Tx, m string) error {
		effects = append(effects, m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(id string, want dedupe.Outcome) {
		t.Helper()
		if o, err := c.Handle(ctx, id); o != want || err != nil {
			t.Fatalf("Handle(%s) = %v, %v; want %v", id, o, err, want)
		}
	}
	for _, id := range []string{"old-1", "old-2", "old-expired"} {
		handle(id, dedupe.OutcomeClaimed)
	}
	db.Exec(t, "INSERT INTO dedupe_inbox (scope, key, state, attempts, token, created_at, updated_at, expires_at) SELECT 'history', 'h-' || g, 'complete', 1, g, now(), now(), now() + interval '1 day' FROM generate_series(1, 2000) g")

	applied, err := m.Up(ctx)
	if err != nil || len(applied) != 1 || applied[0].Version != 2 {
		t.Fatalf("upgrade = %+v, %v", applied, err)
	}
	if n := checks(); n != 0 {
		t.Fatalf("the upgraded table keeps %d table checks", n)
	}
	if n := db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != 2003 {
		t.Fatalf("rows after the upgrade = %d, want 2003", n)
	}
	if n := db.Count(t, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'dedupe_inbox'::regclass
		AND attname IN ('scope', 'key', 'state') AND format_type(atttypid, NULL) IN ('dedupe_inbox_keypart', 'dedupe_inbox_state')`); n != 3 {
		t.Fatalf("%d of scope, key, state have the domains", n)
	}
	// The same rules hold, now in the domains.
	for _, bad := range []string{
		"INSERT INTO dedupe_inbox (scope, key, state, token, created_at, updated_at, expires_at) VALUES ('s', 'bad', 'done', 1, now(), now(), now())",
		"INSERT INTO dedupe_inbox (scope, key, state, token, created_at, updated_at, expires_at) VALUES ('', 'bad', 'complete', 1, now(), now(), now())",
		"INSERT INTO dedupe_inbox (scope, key, state, token, created_at, updated_at, expires_at) VALUES ('s', repeat('k', 256), 'complete', 1, now(), now(), now())",
		"UPDATE dedupe_inbox SET state = 'done' WHERE key = 'old-1'",
	} {
		if _, err := db.Pool.Exec(ctx, bad); func() bool { code, _ := pgerr.SQLState(err); return code != "23514" }() {
			t.Errorf("%s: err = %v, want a check violation", bad, err)
		}
	}

	handle("old-1", dedupe.OutcomeDuplicate)
	handle("old-2", dedupe.OutcomeDuplicate)
	handle("new-1", dedupe.OutcomeClaimed)
	handle("new-1", dedupe.OutcomeDuplicate)
	if want := []string{"old-1", "old-2", "old-expired", "new-1"}; len(effects) != len(want) {
		t.Fatalf("effects = %v, want %v", effects, want)
	}
	db.Exec(t, "UPDATE dedupe_inbox SET expires_at = now() - interval '1 hour' WHERE key = 'old-expired' OR scope = 'history'")
	if n, err := inbox.Purge(ctx, 0); err != nil || n != 2001 {
		t.Fatalf("purge = %d, %v; want 2001", n, err)
	}
	if n := db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != 3 {
		t.Fatalf("rows after the purge = %d, want 3", n)
	}

	// Down to 001 again: the table's checks come back, the domains go.
	if _, err := m.Down(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := checks(); n != 3 {
		t.Fatalf("after down: %d checks, want 3", n)
	}
	if n := db.Count(t, "SELECT count(*) FROM pg_type WHERE typnamespace = $1::regnamespace AND typname IN ('dedupe_inbox_keypart', 'dedupe_inbox_state')", db.Schema); n != 0 {
		t.Fatalf("after down: %d domains left", n)
	}
	handle("old-1", dedupe.OutcomeDuplicate)
}
