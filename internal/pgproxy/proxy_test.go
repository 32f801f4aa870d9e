package pgproxy_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

func start(t *testing.T, db *dbtest.DB, policy pgproxy.Policy) (*pgproxy.Proxy, string) {
	t.Helper()
	host, err := pgproxy.Host(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgproxy.Start(host, policy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u, err := p.URL(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	return p, u
}

// commitThrough inserts a row in a transaction through a proxy that applies
// action to its COMMIT, and returns the proxy, the database (table x holds
// the row if the COMMIT applied) and what the COMMIT returned.
func commitThrough(t *testing.T, action pgproxy.Action) (*pgproxy.Proxy, *dbtest.DB, error) {
	t.Helper()
	db := dbtest.New(t)
	db.Exec(t, `CREATE TABLE x (id int)`)
	p, u := start(t, db, func(ev pgproxy.Event) pgproxy.Action {
		if ev.Kind == pgproxy.Commit {
			return action
		}
		return pgproxy.Forward
	})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO x VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	return p, db, tx.Commit(ctx)
}

// TestDroppedCommitReplyCommits: the client sees an error, the server kept
// the transaction.
func TestDroppedCommitReplyCommits(t *testing.T) {
	t.Parallel()
	p, db, err := commitThrough(t, pgproxy.DropReply)
	if err == nil {
		t.Fatal("commit whose reply was dropped returned nil")
	}
	if n := db.Count(t, `SELECT count(*) FROM x`); n != 1 {
		t.Fatalf("rows = %d, want 1: the COMMIT reached the server", n)
	}
	if s := p.Stats(); s.DroppedReplys != 1 || s.Commits != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

// TestFatalAfterCommitReply: the COMMIT's answer reaches the client, then a
// FATAL error in place of its ReadyForQuery. pgx reports the server error
// for the COMMIT although the transaction committed: an error with an
// SQLSTATE is not proof that a COMMIT did not apply.
func TestFatalAfterCommitReply(t *testing.T) {
	t.Parallel()
	p, db, err := commitThrough(t, pgproxy.FatalAfterReply)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57P01" || pgErr.Severity != "FATAL" {
		t.Fatalf("commit answered then ended with FATAL = %v, want the FATAL 57P01 server error", err)
	}
	if n := db.Count(t, `SELECT count(*) FROM x`); n != 1 {
		t.Fatalf("rows = %d, want 1: the COMMIT was answered", n)
	}
	if s := p.Stats(); s.Fatals != 1 || s.Commits != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

// TestCutBeforeCommitRollsBack: the COMMIT never reached the server.
func TestCutBeforeCommitRollsBack(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Exec(t, `CREATE TABLE x (id int)`)
	_, u := start(t, db, func(ev pgproxy.Event) pgproxy.Action {
		if ev.Kind == pgproxy.Commit {
			return pgproxy.Cut
		}
		return pgproxy.Forward
	})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO x VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("commit over a cut connection returned nil")
	}
	dbtest.WaitFor(t, 30e9, "the server to end the cut session", func() bool {
		return db.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND query ILIKE 'INSERT INTO x%'`) == 0
	})
	if n := db.Count(t, `SELECT count(*) FROM x`); n != 0 {
		t.Fatalf("rows = %d, want 0", n)
	}
}

// TestForwardsEverything: with no policy it is a plain proxy, TLS refused.
func TestForwardsEverything(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	_, u := start(t, db, nil)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u+"&sslmode=prefer")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT $1::int + 1`, 41).Scan(&n); err != nil || n != 42 {
		t.Fatalf("query = %d, %v", n, err)
	}
}
