package drivertest_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// kit is one driver as the contract sees it: how to open the inbox's DB on
// a URL, and what a handler does with the driver's transaction.
type kit[TTx any] struct {
	name string
	// open returns the DB of url, closed when the test ends.
	open func(t testing.TB, url string) dedupe.DB
	// exec runs a statement in the handler's transaction.
	exec func(ctx context.Context, tx TTx, sql string, args ...any) error
	// begin begins a transaction of db the caller ends, for the calls that
	// join the caller's transaction (Claim, ClaimBatch, Enqueue).
	begin func(ctx context.Context, db dedupe.DB) (TTx, error)
	// querier is tx as those calls take it.
	querier func(tx TTx) dedupe.Querier
	commit  func(ctx context.Context, tx TTx) error
	// rollback ends tx without committing.
	rollback func(ctx context.Context, tx TTx) error
}

var pgxKit = pgxKitWith("pgx", func(*pgx.ConnConfig) {})

// pgxKitWith is pgx over pools whose connection configuration edit
// changed. On a default pool a Consumer sends its claim round straight over
// pgconn; with a tracer, or in another statement mode, through pgx's batch.
func pgxKitWith(name string, edit func(*pgx.ConnConfig)) kit[pgx.Tx] {
	k := pgxBase
	k.name = name
	k.open = func(t testing.TB, url string) dedupe.DB {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		edit(cfg.ConnConfig)
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	return k
}

// tracer is a pgx query tracer that records nothing: its presence alone
// sends the claim round through pgx's pipelined batch.
type tracer struct{}

func (tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// pgxBase is what every pgx kit shares.
var pgxBase = kit[pgx.Tx]{
	exec: func(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	},
	begin: func(ctx context.Context, db dedupe.DB) (pgx.Tx, error) {
		return db.(*pgxpool.Pool).Begin(ctx)
	},
	querier:  func(tx pgx.Tx) dedupe.Querier { return tx },
	commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
	rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
}

// sqlKit is database/sql over the named driver.
func sqlKit(driverName string) kit[*sql.Tx] {
	var handles sync.Map // dedupe.DB → *sql.DB; subtests run in parallel
	return kit[*sql.Tx]{
		name: "database/sql+" + driverName,
		open: func(t testing.TB, url string) dedupe.DB {
			db, err := sql.Open(driverName, url)
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(16)
			t.Cleanup(func() { _ = db.Close() })
			d := dedupe.SQL(db)
			handles.Store(d, db)
			return d
		},
		exec: func(ctx context.Context, tx *sql.Tx, sql string, args ...any) error {
			_, err := tx.ExecContext(ctx, sql, args...)
			return err
		},
		begin: func(ctx context.Context, db dedupe.DB) (*sql.Tx, error) {
			h, _ := handles.Load(db)
			return h.(*sql.DB).BeginTx(ctx, nil)
		},
		querier:  dedupe.SQLTx,
		commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
	}
}

// TestContract runs the contract against each driver.
func TestContract(t *testing.T) {
	t.Run("pgx", func(t *testing.T) { t.Parallel(); contract(t, pgxKit) })
	t.Run("pgx-traced", func(t *testing.T) {
		t.Parallel()
		contract(t, pgxKitWith("pgx-traced", func(c *pgx.ConnConfig) { c.Tracer = dbtest.NopTracer{} }))
	})
	t.Run("pgx-exec-mode", func(t *testing.T) {
		t.Parallel()
		contract(t, pgxKitWith("pgx-exec-mode", func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeExec }))
	})
	t.Run("database-sql-pgx-stdlib", func(t *testing.T) { t.Parallel(); contract(t, sqlKit("pgx")) })
	t.Run("database-sql-lib-pq", func(t *testing.T) { t.Parallel(); contract(t, sqlKit("postgres")) })
}

// TestHandlerOfTheOtherDriverIsRefused: a handler's transaction type must be
// its inbox driver's; the other is refused at construction, never at the
// first message.
func TestHandlerOfTheOtherDriverIsRefused(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	sqlInbox, err := dedupe.New(sqlKit("pgx").open(t, db.URL), dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pgxInbox, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := dedupe.ConsumerConfig[string]{Scope: "s", Key: func(m string) (string, error) { return m, nil }}
	_, err1 := dedupe.NewConsumer(sqlInbox, cfg, func(context.Context, pgx.Tx, string) error { return nil })
	_, err2 := dedupe.NewConsumer(pgxInbox, cfg, func(context.Context, *sql.Tx, string) error { return nil })
	_, err3 := dedupe.NewBatchConsumerFunc(pgxInbox, cfg, func(context.Context, *sql.Tx, []string) error { return nil })
	for _, err := range []error{err1, err2, err3} {
		var ce *dedupe.ConfigError
		if !errors.As(err, &ce) || ce.Field != "handler" {
			t.Fatalf("handler of the other driver: err = %v, want a *ConfigError on handler", err)
		}
	}
	if _, err := dedupe.New(struct{ dedupe.Querier }{db.Pool}, dedupe.Config{}); err == nil {
		t.Fatal("New over a bare Querier: want a *ConfigError")
	}
}
