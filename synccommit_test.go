package dedupe_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// TestHandleSynchronousCommitForClaimOnly: ConsumerConfig.SynchronousCommit
// is the claim transaction's synchronous_commit, next to its lock timeout,
// over every way a claim's transaction begins (pgx's direct round, pgx in
// QueryExecModeExec, database/sql), and only that transaction's: the
// connection's own setting is unchanged afterwards.
func TestHandleSynchronousCommitForClaimOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey, SynchronousCommit: "remote_apply",
		LockTimeout: 250 * time.Millisecond}
	type seen struct{ syncCommit, lockTimeout string }
	check := func(t *testing.T, name string, got seen, after string) {
		t.Helper()
		if got != (seen{"remote_apply", "250ms"}) {
			t.Errorf("%s: the handler's transaction has synchronous_commit %q, lock_timeout %q; want remote_apply, 250ms",
				name, got.syncCommit, got.lockTimeout)
		}
		if after != "on" {
			t.Errorf("%s: the connection's synchronous_commit after the claim = %q, want the default on", name, after)
		}
	}
	for name, edit := range map[string]func(*pgxpool.Config){
		"pgx direct": nil,
		"pgx exec mode": func(c *pgxpool.Config) {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		},
	} {
		pool := directPool(t, b, 1, edit) // one connection: the check after the claim runs on it
		var got seen
		c, err := dedupe.NewConsumer(newInbox(t, pool, b), cfg, func(ctx context.Context, tx pgx.Tx, o order) error {
			return tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('lock_timeout')`).
				Scan(&got.syncCommit, &got.lockTimeout)
		})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := c.Handle(ctx, order{ID: "o-" + name}); err != nil || out != dedupe.OutcomeClaimed {
			t.Fatalf("%s: handle = %v, %v", name, out, err)
		}
		var after string
		if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		check(t, name, got, after)
	}

	db, err := sql.Open("pgx", b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	var got seen
	c, err := dedupe.NewConsumer(newInbox(t, dedupe.SQL(db), b), cfg, func(ctx context.Context, tx *sql.Tx, o order) error {
		return tx.QueryRowContext(ctx, `SELECT current_setting('synchronous_commit'), current_setting('lock_timeout')`).
			Scan(&got.syncCommit, &got.lockTimeout)
	})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.Handle(ctx, order{ID: "o-sql"}); err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("database/sql: handle = %v, %v", out, err)
	}
	var after string
	if err := db.QueryRowContext(ctx, `SHOW synchronous_commit`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	check(t, "database/sql", got, after)

	if _, err := dedupe.NewConsumer(b.inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey,
		SynchronousCommit: "remote_apply'; DROP TABLE x; --"}, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("an unknown synchronous_commit: %v, want ErrInvalidConfig", err)
	}
}

// TestCheckReplicationWithoutStandby: a server no standby streams from has
// nothing a failover could lose; CheckReplication says so and warns of
// nothing. (internal/failover checks it with standbys.)
func TestCheckReplicationWithoutStandby(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{SynchronousCommit: "local"}, nil)
	r, err := c.CheckReplication(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Standbys != 0 || r.SynchronousCommit != "local" || r.Synchronous() || r.AckMayBeLost() {
		t.Fatalf("CheckReplication without a standby = %+v (synchronous %v, ack may be lost %v); want 0 standbys, local, false, false",
			r, r.Synchronous(), r.AckMayBeLost())
	}
}
