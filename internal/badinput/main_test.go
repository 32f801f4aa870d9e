package badinput_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// env is a migrated schema, its inbox and a handler that counts its runs.
type env struct {
	db    *dbtest.DB
	inbox *dedupe.Inbox
}

func setup(t *testing.T) *env {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 4})
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_id text NOT NULL)`)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{db: db, inbox: inbox}
}

// effect is the handler's one write.
func effect(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_id) VALUES ($1)", id)
	return err
}

// assertNothingWritten fails unless the inbox and the effects are empty.
func (e *env) assertNothingWritten(t *testing.T) {
	t.Helper()
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != 0 {
		t.Errorf("inbox rows = %d, want 0", n)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != 0 {
		t.Errorf("effects = %d, want 0", n)
	}
}

// configField is the field named by the *ConfigError in err's chain: the
// webhook's or httpidem's own, else the core's ("" when there is none).
func configField(err error) string {
	var we *dedupe.ConfigError
	var he *dedupe.ConfigError
	var de *dedupe.ConfigError
	switch {
	case errors.As(err, &we):
		return we.Field
	case errors.As(err, &he):
		return he.Field
	case errors.As(err, &de):
		return de.Field
	}
	return ""
}
