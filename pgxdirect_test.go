package dedupe_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// TestDirectRoundConnectionLost: the connection breaks in the middle of the
// claim round that a pgx pool sends straight over pgconn, before the claim
// reaches the server (Cut) or after the server ran the round but before its
// answer arrives (DropReply: BEGIN, the claim and the savepoint ran in a
// transaction that never commits). Handle reports a plain failure, nothing
// is committed, the broken connection does not stay acquired, and the
// redelivery claims the key and runs the handler once.
func TestDirectRoundConnectionLost(t *testing.T) {
	t.Parallel()
	for _, action := range []pgproxy.Action{pgproxy.Cut, pgproxy.DropReply} {
		b := setup(t)
		pool, p := faultyPool(t, b, pgproxy.Once(action, runsInsert))
		c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		out, err := c.Handle(ctx, order{ID: "o-round"})
		if err == nil || out == dedupe.OutcomeClaimed || errors.Is(err, dedupe.ErrOutcomeUnknown) {
			t.Fatalf("action %d: handle with the round broken = %v, %v; want a plain failure", action, out, err)
		}
		if p.Stats().Of(action) != 1 {
			t.Fatalf("action %d: the proxy acted %d times, want 1", action, p.Stats().Of(action))
		}
		if got := b.effects(t, "o-round"); got != 0 {
			t.Fatalf("action %d: effects = %d, want 0", action, got)
		}
		if _, err := b.inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: "o-round"}); !errors.Is(err, dedupe.ErrNotFound) {
			t.Fatalf("action %d: the key after the broken round: %v, want ErrNotFound", action, err)
		}
		if n := dbtest.SettledAcquired(pool); n != 0 {
			t.Fatalf("action %d: %d connections still acquired", action, n)
		}
		if out, err := c.Handle(ctx, order{ID: "o-round"}); err != nil || out != dedupe.OutcomeClaimed {
			t.Fatalf("action %d: redelivery = %v, %v; want claimed", action, out, err)
		}
		if out, err := c.Handle(ctx, order{ID: "o-round"}); err != nil || out != dedupe.OutcomeDuplicate {
			t.Fatalf("action %d: second redelivery = %v, %v; want duplicate", action, out, err)
		}
		if got := b.effects(t, "o-round"); got != 1 {
			t.Fatalf("action %d: effects = %d, want 1", action, got)
		}
	}
}

// TestDirectRoundPreparesAgain: the direct round's statements are prepared
// once per connection. When they go away on the server (DEALLOCATE ALL) or
// their result type changes (the inbox altered by hand), the round prepares
// them anew, or sends the claim through pgx when the types are no longer the
// ones it encodes; no message fails or runs twice.
func TestDirectRoundPreparesAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one connection: every statement below meets the prepared ones
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The handler's own statement goes as a simple query, so that it does
	// not depend on pgx's statement cache, which DEALLOCATE ALL empties too.
	c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
		func(ctx context.Context, tx pgx.Tx, o order) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", pgx.QueryExecModeSimpleProtocol, o.ID)
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(id string, want dedupe.Outcome) {
		t.Helper()
		if out, err := c.Handle(ctx, order{ID: id}); err != nil || out != want {
			t.Fatalf("handle %s = %v, %v; want %v", id, out, err, want)
		}
	}
	handle("o-1", dedupe.OutcomeClaimed)
	if _, err := pool.Exec(ctx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	handle("o-2", dedupe.OutcomeClaimed)
	handle("o-1", dedupe.OutcomeDuplicate)
	// The read of a taken key goes away alone, between rounds; a new inbox
	// (no duplicates seen: it reads a taken key after the round) meets it
	// only after its claim found the key taken.
	preparedAgain := deallocatePeek(t, func(q string, dest ...any) error { return pool.QueryRow(ctx, q).Scan(dest...) },
		func(q string) error { _, err := pool.Exec(ctx, q); return err })
	c2, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c2.Handle(ctx, order{ID: "o-2"}); err != nil || out != dedupe.OutcomeDuplicate {
		t.Fatalf("handle o-2 with the read of a taken key deallocated = %v, %v; want duplicate", out, err)
	}
	preparedAgain()
	// attempts becomes bigint: the prepared claim's result type changed.
	b.db.Exec(t, "ALTER TABLE dedupe_inbox ALTER COLUMN attempts TYPE bigint")
	handle("o-3", dedupe.OutcomeClaimed)
	handle("o-2", dedupe.OutcomeDuplicate)
	handle("o-3", dedupe.OutcomeDuplicate)
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		if got := b.effects(t, id); got != 1 {
			t.Fatalf("effects of %s = %d, want 1", id, got)
		}
	}
}

// directPool is a default pool (direct round) on b's schema with maxConns
// connections, edited by edit.
func directPool(t *testing.T, b *bundle, maxConns int32, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return directPoolAt(t, b.db.URL, maxConns, edit)
}

// directPoolAt is directPool on url (a proxy's, say).
func directPoolAt(t *testing.T, url string, maxConns int32, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	if edit != nil {
		edit(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// pgxpool's Close waits for every acquired connection: a leaked
		// one would hang the test binary (the test fails on it instead).
		if t.Failed() && pool.Stat().AcquiredConns() > 0 {
			return
		}
		if dbtest.SettledAcquired(pool) == 0 {
			pool.Close()
		}
	})
	return pool
}

// TestDirectRoundLockTimeoutKeepsConnection: a claim that fails with
// 55P03 in the middle of the direct round rolls back and hands its
// connection back clean: the one connection of the pool is reused, not
// destroyed, and the redelivery claims once.
func TestDirectRoundLockTimeoutKeepsConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool := directPool(t, b, 1, nil)
	c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey,
		LockTimeout: 50 * time.Millisecond}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.Handle(ctx, order{ID: "warm"}); err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("warm = %v, %v", out, err)
	}
	tx := holdKey(t, b, "held")
	for range 3 {
		if out, err := c.Handle(ctx, order{ID: "held"}); out != dedupe.OutcomeInFlight || !errors.Is(err, dedupe.ErrInFlight) {
			t.Fatalf("held = %v, %v; want in flight", out, err)
		}
	}
	if n := dbtest.SettledAcquired(pool); n != 0 {
		t.Fatalf("%d acquired", n)
	}
	if got := pool.Stat().NewConnsCount(); got != 1 {
		t.Fatalf("connections opened = %d, want 1 (a lock timeout must not cost the connection)", got)
	}
	_ = tx.Rollback(ctx)
	redeliverOnce(t, b, c, "held")
}

// holdKey claims key id of scope orders in a transaction of its own, held
// until the caller rolls it back (or the test ends).
func holdKey(t *testing.T, b *bundle, id string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if cl, err := b.inbox.Claim(ctx, tx, dedupe.Key{Scope: "orders", ID: id}); err != nil || cl.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("claim = %v, %v", cl, err)
	}
	return tx
}

// redeliverOnce handles order id, which must be claimed now, and checks
// that it has exactly one effect.
func redeliverOnce(t *testing.T, b *bundle, c *dedupe.Consumer[order], id string) {
	t.Helper()
	if out, err := c.Handle(context.Background(), order{ID: id}); err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("redelivery of %s = %v, %v", id, out, err)
	}
	if got := b.effects(t, id); got != 1 {
		t.Fatalf("effects of %s = %d, want 1", id, got)
	}
}

// TestDirectRoundCancelWhileWaiting: the context ends while the direct
// round's claim waits on a concurrent claim of the key. Nothing commits,
// no connection stays acquired, the redelivery runs once.
func TestDirectRoundCancelWhileWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool := directPool(t, b, 2, nil)
	c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	tx := holdKey(t, b, "o-c")
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	out, err := c.Handle(cctx, order{ID: "o-c"})
	cancel()
	if err == nil || out == dedupe.OutcomeClaimed || errors.Is(err, dedupe.ErrOutcomeUnknown) {
		t.Fatalf("cancelled = %v, %v; want a plain failure", out, err)
	}
	if n := dbtest.SettledAcquired(pool); n != 0 {
		t.Fatalf("%d acquired", n)
	}
	_ = tx.Rollback(ctx)
	redeliverOnce(t, b, c, "o-c")
}

// TestDirectRoundConcurrentStress: many goroutines on a small pool with a
// lock timeout and serializable transactions; handlers fail now and then. Every key ends with exactly one effect and nothing leaks.
func TestDirectRoundConcurrentStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := directPool(t, b, 4, nil)
	var failed sync.Map
	c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey,
		LockTimeout: 20 * time.Millisecond, IsoLevel: pgx.Serializable, TxRetries: 20},
		func(ctx context.Context, tx pgx.Tx, o order) error {
			if o.Total%7 == 0 {
				if _, loaded := failed.LoadOrStore(o.ID, true); !loaded {
					return errors.New("first attempt fails")
				}
			}
			_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", pgx.QueryExecModeSimpleProtocol, o.ID)
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	const keys, copies = 40, 3
	var unexpected atomic.Int64
	together(8, func(w int) {
		ctx := context.Background()
		for k := range keys {
			o := order{ID: fmt.Sprintf("k-%d", k), Total: k}
			for range copies {
				for try := 0; ; try++ {
					out, err := c.Handle(ctx, o)
					if err == nil || out == dedupe.OutcomeInFlight || out == dedupe.OutcomeRetry || errors.Is(err, dedupe.ErrRetryable) {
						if err == nil {
							break
						}
						if try > 200 {
							t.Errorf("key %s: still %v, %v", o.ID, out, err)
							unexpected.Add(1)
							break
						}
						continue
					}
					t.Errorf("key %s: %v, %v", o.ID, out, err)
					unexpected.Add(1)
					break
				}
			}
		}
	})
	for k := range keys {
		if got := b.effects(t, fmt.Sprintf("k-%d", k)); got != 1 {
			t.Errorf("effects of k-%d = %d, want 1", k, got)
		}
	}
	if n := dbtest.SettledAcquired(pool); n != 0 {
		t.Fatalf("%d acquired", n)
	}
}

// preparedOnConn counts the server-side prepared statements of the only
// connection of pool whose name starts with prefix ("" for all).
func preparedOnConn(t *testing.T, pool *pgxpool.Pool, prefix string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE $1",
		pgx.QueryExecModeSimpleProtocol, prefix+"%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDirectRoundClaimStatementsHonourStatementCacheCapacity: pgx bounds the
// statements it keeps prepared on a connection (StatementCacheCapacity,
// evicting and deallocating the least recently used), and so does the
// direct round with its own: an application with an inbox per tenant
// schema must not grow every backend without bound. (Found by review: the
// first version kept two statements per inbox table on every connection
// for the connection's life.)
func TestDirectRoundClaimStatementsHonourStatementCacheCapacity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		tracer   bool // a tracer sends the claim through pgx's batch: the control
		capacity int  // 4 holds no table's statements: pgx's batch; 9 one table's, 11 two tables'
	}{{"pgx batch", true, 11}, {"direct round, small cache", false, 4}, {"direct round, one table", false, 9}, {"direct round", false, 11}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const tables = 6
			capacity := tc.capacity
			pool := directPool(t, b, 1, func(c *pgxpool.Config) {
				c.ConnConfig.StatementCacheCapacity = capacity
				if tc.tracer {
					c.ConnConfig.Tracer = dbtest.NopTracer{}
				}
			})
			ctx := context.Background()
			for n := range tables {
				table := fmt.Sprintf("inbox_%d", n)
				if err := dedupe.Migrate(ctx, b.db.Pool, dedupe.MigrateConfig{InboxTable: table, Lines: []dedupe.Line{dedupe.LineInbox}}); err != nil {
					t.Fatal(err)
				}
				inbox, err := dedupe.New(pool, dedupe.Config{Table: table, Logger: dbtest.Logger(t)})
				if err != nil {
					t.Fatal(err)
				}
				// Three isolation levels: three BEGINs prepared (found by
				// review: the bound counted one).
				isos := []pgx.TxIsoLevel{"", pgx.RepeatableRead, pgx.Serializable}
				c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey,
					LockTimeout: time.Second, IsoLevel: isos[n%len(isos)]}, func(ctx context.Context, tx pgx.Tx, o order) error {
					_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", pgx.QueryExecModeSimpleProtocol, o.ID)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				if out, err := c.Handle(ctx, order{ID: "o"}); err != nil || out != dedupe.OutcomeClaimed {
					t.Fatalf("handle = %v, %v", out, err)
				}
			}
			if got := preparedOnConn(t, pool, ""); got > capacity {
				t.Fatalf("%d statements prepared on the connection (%d named dedupe_), want at most StatementCacheCapacity = %d",
					got, preparedOnConn(t, pool, "dedupe_"), capacity)
			}
		})
	}
}

// TestDirectRoundNoNamedStatementsWhenConnectionsAreInExecMode: a pool whose
// connections are put in QueryExecModeExec (for PgBouncer before 1.21) by
// BeforeConnect, the hook that edits each new connection's configuration,
// must not get named prepared statements: the round reads each
// connection's own configuration, not only the pool's. (Found by review.)
func TestDirectRoundNoNamedStatementsWhenConnectionsAreInExecMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := directPool(t, b, 1, func(c *pgxpool.Config) {
		c.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			cc.DefaultQueryExecMode = pgx.QueryExecModeExec
			return nil
		}
	})
	c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.Handle(context.Background(), order{ID: "o"}); err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("handle = %v, %v", out, err)
	}
	if got := preparedOnConn(t, pool, ""); got != 0 {
		t.Fatalf("%d named statements prepared on a connection in QueryExecModeExec (%d named dedupe_), want 0",
			got, preparedOnConn(t, pool, "dedupe_"))
	}
}

// TestDirectRoundNotMigrated: the direct round over a table that does not
// exist fails at its prepare with ErrNotMigrated, as pgx's batch did, and
// hands the connection back.
func TestDirectRoundNotMigrated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := directPool(t, b, 1, nil)
	inbox, err := dedupe.New(pool, dedupe.Config{Table: "missing_inbox", Logger: dbtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.Handle(context.Background(), order{ID: "o"}); !errors.Is(err, dedupe.ErrNotMigrated) {
			t.Fatalf("handle = %v, want ErrNotMigrated", err)
		}
	}
	if n := dbtest.SettledAcquired(pool); n != 0 {
		t.Fatalf("%d acquired", n)
	}
	if got := pool.Stat().NewConnsCount(); got != 1 {
		t.Fatalf("connections opened = %d, want 1", got)
	}
}

// TestDirectRoundPanickingClockLeaksNoConnection: a Config.Clock (the test
// seam for now()) that panics leaves no connection acquired: the round
// reads it before it acquires one, as pgx's batch does. (Found by review:
// the first version read it after.)
func TestDirectRoundPanickingClockLeaksNoConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		tracer bool // a tracer sends the claim through pgx's batch: the control
	}{{"pgx batch", true}, {"direct round", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pool := directPool(t, b, 2, func(c *pgxpool.Config) {
				if tc.tracer {
					c.ConnConfig.Tracer = dbtest.NopTracer{}
				}
			})
			var boom atomic.Bool
			inbox, err := dedupe.New(pool, dedupe.Config{Logger: dbtest.Logger(t), Clock: func() time.Time {
				if boom.Load() {
					panic("clock")
				}
				return time.Now()
			}})
			if err != nil {
				t.Fatal(err)
			}
			c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
			if err != nil {
				t.Fatal(err)
			}
			boom.Store(true)
			func() {
				defer func() { _ = recover() }()
				_, _ = c.Handle(context.Background(), order{ID: "o"})
			}()
			if n := dbtest.SettledAcquired(pool); n != 0 {
				t.Fatalf("%d connections still acquired after a panic in the claim round", n)
			}
		})
	}
}

// TestDirectRoundOverDatabaseSQLPreparesAgain: over database/sql (pgx's
// stdlib) the claim and the savepoint follow BEGIN as the direct round's
// prepared statements. When they go away on the server (DEALLOCATE ALL) the
// transaction that met it is aborted: Handle claims again in a new one, and
// the connection prepares them anew; when the inbox's column types change,
// claims go through pgx's batch. No message fails or runs twice.
func TestDirectRoundOverDatabaseSQLPreparesAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db, err := sql.Open("pgx", b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1) // one connection: every statement below meets the prepared ones
	inbox, err := dedupe.New(dedupe.SQL(db), b.inbox.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The handler's statement has no arguments, so it goes as a simple
	// query, independent of pgx's statement cache, which DEALLOCATE ALL
	// empties too. The test's ids need no quoting.
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
		func(ctx context.Context, tx *sql.Tx, o order) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO effects (msg_key) VALUES ('"+o.ID+"')")
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(id string, want dedupe.Outcome) {
		t.Helper()
		if out, err := c.Handle(ctx, order{ID: id}); err != nil || out != want {
			t.Fatalf("handle %s = %v, %v; want %v", id, out, err, want)
		}
	}
	handle("o-1", dedupe.OutcomeClaimed)
	if got := preparedOnSQLConn(t, db); got != 2 {
		t.Fatalf("%d dedupe_ statements prepared on the connection, want the claim's and the savepoint's (a taken key is read only after a claim finds one)", got)
	}
	if _, err := db.ExecContext(ctx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	handle("o-2", dedupe.OutcomeClaimed)
	handle("o-1", dedupe.OutcomeDuplicate)
	// The read of a taken key goes away alone, between rounds; a new inbox
	// (no duplicates seen: it reads a taken key after the round) meets it
	// only after its claim found the key taken, in a transaction it
	// cannot retry in.
	preparedAgain := deallocatePeek(t, func(q string, dest ...any) error { return db.QueryRowContext(ctx, q).Scan(dest...) },
		func(q string) error { _, err := db.ExecContext(ctx, q); return err })
	inbox2, err := dedupe.New(dedupe.SQL(db), b.inbox.Config())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := dedupe.NewConsumer(inbox2, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
		func(ctx context.Context, tx *sql.Tx, o order) error {
			return errors.New("the handler ran for a duplicate")
		})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c2.Handle(ctx, order{ID: "o-2"}); err != nil || out != dedupe.OutcomeDuplicate {
		t.Fatalf("handle o-2 with the read of a taken key deallocated = %v, %v; want duplicate", out, err)
	}
	preparedAgain()
	// After the ALTER, pgx's stdlib meets its own cached statements with the
	// old result type once (0A000, which pgx then drops): that message fails
	// and is redelivered, as a broker would.
	b.db.Exec(t, "ALTER TABLE dedupe_inbox ALTER COLUMN attempts TYPE bigint")
	redelivered := func(id string, want dedupe.Outcome) {
		t.Helper()
		out, err := c.Handle(ctx, order{ID: id})
		if code, ok := sqlState(err); ok && code == "0A000" {
			out, err = c.Handle(ctx, order{ID: id})
		}
		if err != nil || out != want {
			t.Fatalf("handle %s = %v, %v; want %v", id, out, err, want)
		}
	}
	redelivered("o-3", dedupe.OutcomeClaimed)
	redelivered("o-2", dedupe.OutcomeDuplicate)
	redelivered("o-3", dedupe.OutcomeDuplicate)
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		if got := b.effects(t, id); got != 1 {
			t.Fatalf("effects of %s = %d, want 1", id, got)
		}
	}
}

// deallocatePeek deallocates, on the server, the direct round's read of a
// taken key (prepared on the only connection that query and exec use),
// leaving the driver's statement cache to believe it is still there.
// It returns a check, for after the next duplicate, that the read was met
// gone and prepared again.
func deallocatePeek(t *testing.T, query func(q string, dest ...any) error, exec func(q string) error) (preparedAgain func()) {
	t.Helper()
	var name string
	if err := query("SELECT name FROM pg_prepared_statements WHERE name LIKE 'dedupe_%' AND statement LIKE 'SELECT state,%'", &name); err != nil {
		t.Fatalf("the read of a taken key is not prepared on the connection: %v", err)
	}
	if err := exec("DEALLOCATE " + name); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		var n int
		if err := query("SELECT count(*) FROM pg_prepared_statements WHERE name = '"+name+"'", &n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("the read of a taken key (%s) was not prepared again: the duplicate did not read through it", name)
		}
	}
}

// sqlState is the SQLSTATE of a *pgconn.PgError in err's chain.
func sqlState(err error) (string, bool) {
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pe.Code, true
	}
	return "", false
}

// preparedOnSQLConn counts the direct round's statements prepared on the
// only connection of db.
func preparedOnSQLConn(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'dedupe_%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDirectRoundInboxesOfOneTableShareStatements: an application may build
// an Inbox per subscription or tenant over one table. Their statements are
// the same (the same SQL, so the same names), prepared once per connection:
// the first version counted each Inbox as a table of its own, and past 16 of
// them deallocated and prepared the claim again on every message (found by
// review: 85 prepares for 100 messages over 20 inboxes).
func TestDirectRoundInboxesOfOneTableShareStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var parses atomic.Int64
	u, _ := dbtest.ProxyURL(t, b.db.URL, func(ev pgproxy.Event) pgproxy.Action {
		if !ev.Runs && strings.Contains(ev.Query, "ON CONFLICT (scope, key) DO NOTHING") {
			parses.Add(1)
		}
		return pgproxy.Forward
	})
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var cs []*dedupe.Consumer[order]
	for range 20 {
		c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	const msgs = 100
	for n := range msgs {
		if out, err := cs[n%len(cs)].Handle(context.Background(), order{ID: fmt.Sprint(n)}); err != nil || out != dedupe.OutcomeClaimed {
			t.Fatalf("message %d: %v, %v", n, out, err)
		}
	}
	if got := parses.Load(); got != 1 {
		t.Errorf("the claim was prepared %d times for %d messages over 20 inboxes of one table on one connection, want once", got, msgs)
	}
}

// TestDirectRoundPeeksWithTheClaimOnlyAfterDuplicates: the read of an
// existing key (the peek) goes in the claim's round trip only while the
// inbox's recent claims met duplicates. New keys read nothing; the first
// duplicate after them is read in a second round trip (after the
// savepoint that closes the round); the duplicates after it, and the new
// keys that follow within 64 claims, carry the peek in the round (before
// the savepoint). Every message is classified the same way either way, and
// the round over database/sql (pgx's stdlib) sends the same as over pgx.
func TestDirectRoundPeeksWithTheClaimOnlyAfterDuplicates(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "database/sql"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			testPeeksWithTheClaimOnlyAfterDuplicates(t, driver)
		})
	}
}

func testPeeksWithTheClaimOnlyAfterDuplicates(t *testing.T, driver string) {
	b := setup(t)
	var mu sync.Mutex
	var seen []string // "peek" and "savepoint", in the order the server ran them
	u, _ := dbtest.ProxyURL(t, b.db.URL, func(ev pgproxy.Event) pgproxy.Action {
		q := strings.TrimSpace(ev.Query)
		if ev.Runs && (strings.HasPrefix(q, "SAVEPOINT") || strings.HasPrefix(q, "SELECT state")) {
			mu.Lock()
			seen = append(seen, strings.ToLower(strings.Fields(q)[0]))
			mu.Unlock()
		}
		return pgproxy.Forward
	})
	var h func(context.Context, order) (dedupe.Outcome, error)
	switch driver {
	case "pgx":
		pool := directPoolAt(t, u, 4, nil)
		c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
		if err != nil {
			t.Fatal(err)
		}
		h = c.Handle
	default:
		db, err := sql.Open("pgx", u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		c, err := dedupe.NewConsumer(newInbox(t, dedupe.SQL(db), b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
			func(ctx context.Context, tx *sql.Tx, o order) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", o.ID)
				return err
			})
		if err != nil {
			t.Fatal(err)
		}
		h = c.Handle
	}
	ctx := context.Background()
	// handle handles o and returns what the server ran for it: "" (no
	// peek), "in round" (peek, then savepoint) or "after" (savepoint,
	// then peek).
	handle := func(o order, want dedupe.Outcome) string {
		t.Helper()
		mu.Lock()
		seen = seen[:0]
		mu.Unlock()
		if out, err := h(ctx, o); err != nil || out != want {
			t.Fatalf("handle %s = %v, %v; want %v", o.ID, out, err, want)
		}
		mu.Lock()
		defer mu.Unlock()
		switch strings.Join(seen, ",") {
		case "savepoint":
			return ""
		case "select,savepoint":
			return "in round"
		case "savepoint,select":
			return "after"
		default:
			t.Fatalf("handle %s ran %q", o.ID, seen)
			return ""
		}
	}
	for _, st := range peekWindowSteps() {
		if got := handle(order{ID: st.id}, st.out); got != st.peek {
			t.Fatalf("%s (%s): peek %q, want %q", st.what, st.id, got, st.peek)
		}
	}
	for _, id := range []string{"new-0", "new-1", "new-2", "later-0", "later-64"} {
		if n := b.effects(t, id); n != 1 {
			t.Fatalf("effects of %s = %d, want 1", id, n)
		}
	}
}

// peekStep is one claim of peekWindowSteps: the key, its outcome, where the
// read of an existing key must run ("" none, "in round" with the claim,
// "after" it) and what the step shows.
type peekStep struct {
	id         string
	out        dedupe.Outcome
	peek, what string
}

// peekWindowSteps are the claims, in order, that show where a claim reads an
// existing key (internal/direct.Ahead): after the claim until a duplicate is met,
// then with it for the 64 claims that follow.
func peekWindowSteps() []peekStep {
	var steps []peekStep
	for k := range 3 {
		steps = append(steps, peekStep{fmt.Sprintf("new-%d", k), dedupe.OutcomeClaimed, "", "a new key before any duplicate"})
	}
	steps = append(steps,
		peekStep{"new-0", dedupe.OutcomeDuplicate, "after", "the first duplicate"},
		peekStep{"new-1", dedupe.OutcomeDuplicate, "in round", "the second duplicate"})
	// The 64 claims after that duplicate carry the peek; the next does not.
	for k := range 64 {
		steps = append(steps, peekStep{fmt.Sprintf("later-%d", k), dedupe.OutcomeClaimed, "in round", "a new key within 64 claims of a duplicate"})
	}
	return append(steps,
		peekStep{"later-64", dedupe.OutcomeClaimed, "", "the new key 65 claims after a duplicate"},
		peekStep{"new-2", dedupe.OutcomeDuplicate, "after", "a duplicate after a run of new keys"})
}
