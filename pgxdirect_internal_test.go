package dedupe

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgxdriver"
)

// TestDirectRoundOnlyWherePgxWouldSendTheSame: the direct claim round is
// used on a pool or connection in pgx's default statement mode without a
// tracer, and nowhere else: a tracer must see every statement, and another
// statement mode (chosen for PgBouncer, say) must not get named prepared
// statements.
func TestDirectRoundOnlyWherePgxWouldSendTheSame(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	pool := func(t *testing.T, edit func(*pgx.ConnConfig)) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		edit(cfg.ConnConfig)
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })

	for _, tc := range []struct {
		name   string
		db     func(t *testing.T) pgxdriver.DB
		direct bool
	}{
		{"default pool", func(t *testing.T) pgxdriver.DB { return pool(t, func(*pgx.ConnConfig) {}) }, true},
		{"connection", func(t *testing.T) pgxdriver.DB { return conn }, true},
		{"tracer", func(t *testing.T) pgxdriver.DB {
			return pool(t, func(c *pgx.ConnConfig) { c.Tracer = dbtest.NopTracer{} })
		}, false},
		{"describe mode", func(t *testing.T) pgxdriver.DB {
			return pool(t, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe })
		}, false},
		{"exec mode", func(t *testing.T) pgxdriver.DB {
			return pool(t, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeExec })
		}, false},
		{"simple protocol", func(t *testing.T) pgxdriver.DB {
			return pool(t, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
		}, false},
		{"wrapped pool", func(t *testing.T) pgxdriver.DB {
			return struct{ pgxdriver.DB }{pool(t, func(*pgx.ConnConfig) {})}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inbox, err := New(tc.db(t), Config{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewConsumer(inbox, ConsumerConfig[string]{Scope: "s", Key: func(m string) (string, error) { return m, nil }},
				func(context.Context, pgx.Tx, string) error { return nil })
			if err != nil {
				t.Fatal(err)
			}
			if got := inbox.direct != nil && c.directBegin != nil; got != tc.direct {
				t.Fatalf("direct round = %v, want %v", got, tc.direct)
			}
		})
	}
}

// TestDirectRoundAllocations bounds what a new key and a duplicate
// allocate in Consumer.Handle over a pgx pool, handler included: the direct
// round measured 35 and 32 per message, against 88 and 85 through pgx's
// pipelined batch. The bound leaves room for the runtime's and the pool's
// own background allocations (AllocsPerRun counts the whole process), not
// for the pipeline's.
func TestDirectRoundAllocations(t *testing.T) {
	db := dbtest.New(t)
	ctx := context.Background()
	if err := Migrate(ctx, db.Pool, MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_key text NOT NULL)`)
	inbox, err := New(db.Pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(inbox, ConsumerConfig[string]{Scope: "s", Key: func(m string) (string, error) { return m, nil }},
		func(ctx context.Context, tx pgx.Tx, m string) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (msg_key) VALUES ($1)`, m)
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	const runs = 300
	keys := make([]string, runs+1)
	for n := range keys {
		keys[n] = "k-" + time.Duration(n).String()
	}
	measure := func(want Outcome) float64 {
		n := 0
		return testing.AllocsPerRun(runs, func() {
			o, err := c.Handle(ctx, keys[n])
			if err != nil || o != want {
				t.Fatalf("Handle(%s) = %v, %v; want %v", keys[n], o, err, want)
			}
			n++
		})
	}
	const bound = 50
	newKey, dup := measure(OutcomeClaimed), measure(OutcomeDuplicate)
	t.Logf("allocations per message: new key %.1f, duplicate %.1f", newKey, dup)
	if newKey > bound || dup > bound {
		t.Errorf("allocations per message: new key %.1f, duplicate %.1f; want at most %d", newKey, dup, bound)
	}
}
