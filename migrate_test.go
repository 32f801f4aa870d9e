package dedupe_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	errs := make([]error, 5)
	together(5, func(i int) { errs[i] = dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}) })
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate %d: %v", i, err)
		}
	}
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	m, err := dedupe.NewMigrator(db.Pool, dedupe.MigrateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := db.Count(t, "SELECT count(*) FROM dedupe_migration"), len(m.Migrations()); got != want {
		t.Fatalf("recorded migrations = %d, want %d", got, want)
	}
}

func TestMigratorStatusDownAndCustomNames(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	cfg := dedupe.Config{Schema: db.Schema + "_custom", Table: "my inbox"}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+cfg.Schema+`" CASCADE`) })
	m, err := dedupe.NewMigrator(db.Pool, dedupe.MigrateConfig{Schema: cfg.Schema, InboxTable: cfg.Table})
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.Status(ctx)
	if err != nil || len(st) == 0 || st[0].Applied {
		t.Fatalf("status before = %+v, %v", st, err)
	}
	applied, err := m.Up(ctx)
	if err != nil || len(applied) != len(st) {
		t.Fatalf("up = %v, %v", applied, err)
	}
	st, err = m.Status(ctx)
	if err != nil || !st[0].Applied || st[0].AppliedAt.IsZero() {
		t.Fatalf("status after = %+v, %v", st, err)
	}
	inbox, err := dedupe.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := inbox.Begin(ctx, dedupe.Key{Scope: "s", ID: "k"}); err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin on custom table = %+v, %v", c, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM "`+cfg.Schema+`"."my inbox"`); n != 1 {
		t.Fatalf("rows in custom table = %d", n)
	}
	reverted, err := m.Down(ctx, 0)
	if err != nil || len(reverted) != len(st) {
		t.Fatalf("down = %v, %v", reverted, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'my inbox'`, cfg.Schema); n != 0 {
		t.Fatal("table still there after down")
	}
}

// TestPlainSQLFileIsCurrent keeps sql/dedupe_inbox.sql (for goose,
// golang-migrate, atlas) equal to the embedded migrations. Regenerate it with
// DEDUPE_WRITE_SQL=1 go test -run TestPlainSQLFileIsCurrent .
func TestPlainSQLFileIsCurrent(t *testing.T) {
	t.Parallel()
	want, err := dedupe.PlainSQL(dedupe.MigrateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("DEDUPE_WRITE_SQL") == "1" {
		if err := os.WriteFile("sql/dedupe_inbox.sql", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("sql/dedupe_inbox.sql")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("sql/dedupe_inbox.sql is stale; regenerate with DEDUPE_WRITE_SQL=1 go test -run TestPlainSQLFileIsCurrent .")
	}
	// And it applies cleanly to an empty schema.
	db := dbtest.New(t)
	if _, err := db.Pool.Exec(context.Background(), want); err != nil {
		t.Fatalf("plain SQL does not apply: %v", err)
	}
}

func TestMigratorStatusIsReadOnly(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	m, err := dedupe.NewMigrator(db.Pool, dedupe.MigrateConfig{Schema: db.Schema + "_never"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.Status(context.Background())
	if err != nil || len(st) == 0 || st[0].Applied {
		t.Fatalf("status = %+v, %v; want all pending", st, err)
	}
	if n := db.Count(t, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", db.Schema+"_never"); n != 0 {
		t.Fatal("Status created the schema")
	}
}

func TestMigrateOneLineOnly(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	cfg := dedupe.Config{Table: "http_keys"}
	if err := dedupe.Migrate(ctx, db.Pool, cfg.Migration()); err != nil {
		t.Fatal(err)
	}
	if n := db.Count(t, "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'dedupe_outbox'", db.Schema); n != 0 {
		t.Fatal("migrating the inbox line created an outbox")
	}
	// The full migration later adds the outbox and leaves the inbox alone.
	m, err := dedupe.NewMigrator(db.Pool, dedupe.MigrateConfig{InboxTable: cfg.Table})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := m.Up(ctx)
	if err != nil || len(applied) == 0 {
		t.Fatalf("up = %+v, %v; want the outbox line", applied, err)
	}
	for _, a := range applied {
		if a.Line != dedupe.LineOutbox {
			t.Fatalf("up applied %s/%03d; want only the outbox line", a.Line, a.Version)
		}
	}
	if _, err := dedupe.NewMigrator(db.Pool, dedupe.MigrateConfig{Lines: []dedupe.Line{"nope"}}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("unknown line: %v", err)
	}
}

// TestMigrateRepeatedLineOnce: a line named twice in MigrateConfig.Lines is
// migrated once, not refused half-way by the database.
func TestMigrateRepeatedLineOnce(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{Lines: []dedupe.Line{dedupe.LineInbox, dedupe.LineInbox}}); err != nil {
		t.Fatalf("Migrate with a repeated line: %v", err)
	}
}
