// Package adaptertest is the one test suite every transport adapter runs, in
// the manner of Watermill's pubsub tests: an adapter describes how to publish
// to and consume from its transport and declares its features; the suite
// fires duplicates, failures and load at it and counts effects exactly.
package adaptertest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// Features are the optional abilities of a transport; the suite runs the
// tests of the declared ones only.
type Features struct {
	// Poison: a message whose handler keeps failing is terminated (or
	// dead-lettered) after RunConfig.MaxAttempts and the others keep flowing.
	Poison bool
	// OrderedPerKey: messages published with the same order key (through
	// Instance.PublishOrdered) are handled in publish order (Kafka
	// partitions). A transport that declares it must set PublishOrdered.
	OrderedPerKey bool
}

// TxEffect is the business work of the suite's handler: the adapter's
// handler calls it with the message's dedup id and body inside the claim's
// transaction, of the inbox driver's type TTx.
type TxEffect[TTx any] func(ctx context.Context, tx TTx, id string, body []byte) error

// Effect is the suite's handler over an inbox over a pgx pool.
type Effect = TxEffect[pgx.Tx]

// SQLEffect is the suite's handler over an inbox over database/sql
// (dedupe.SQL): it receives a *sql.Tx.
type SQLEffect = TxEffect[*sql.Tx]

// RunConfig is how the suite wants a consumer started.
type RunConfig struct {
	Workers     int // concurrent handlers; at least 1
	MaxAttempts int // attempts before a message is poison; 0 for the adapter's default
}

// Instance is one test's private topic (stream, subject, endpoint).
type Instance struct {
	// Publish delivers one message whose dedup key is id. Publishing the same
	// id again must reach the consumer again (a duplicate), so transports
	// with broker-side deduplication must publish duplicates in a way that
	// bypasses it.
	Publish func(ctx context.Context, id string, body []byte) error
	// PublishOrdered is Publish with an order key: messages with the same
	// order key must be handled in publish order. Required with
	// Features.OrderedPerKey.
	PublishOrdered func(ctx context.Context, orderKey, id string, body []byte) error
	// Start runs a consumer on the topic with the given inbox until ctx is
	// cancelled; the returned wait blocks until it stopped and returns its
	// error (nil after a clean cancel).
	Start func(ctx context.Context, inbox *dedupe.Inbox, cfg RunConfig, effect Effect) (wait func() error)
	// StartSQL is Start for an inbox over database/sql (dedupe.SQL over
	// pgx's stdlib), whose handlers receive a *sql.Tx. Required: every
	// transport must serve both drivers.
	StartSQL func(ctx context.Context, inbox *dedupe.Inbox, cfg RunConfig, effect SQLEffect) (wait func() error)
	// Unacked reports how many delivered messages are neither acknowledged
	// nor committed, or -1 if the transport cannot tell.
	Unacked func(ctx context.Context) (int, error)
}

// Transport describes an adapter to the suite.
type Transport struct {
	Name     string
	Features Features
	// New prepares a fresh topic for one test; db is the test's schema.
	New func(t *testing.T, db *dbtest.DB) Instance
}

// Run runs the suite against tr.
func Run(t *testing.T, tr Transport) {
	t.Run("DuplicatesOneEffect", func(t *testing.T) { t.Parallel(); testDuplicates(t, tr) })
	t.Run("FailingHandlerRetriedOneEffect", func(t *testing.T) { t.Parallel(); testFailThenSucceed(t, tr) })
	t.Run("LoadWithDuplicatesExactCount", func(t *testing.T) { t.Parallel(); testLoad(t, tr) })
	if tr.Features.Poison {
		t.Run("PoisonTerminatedOthersFlow", func(t *testing.T) { t.Parallel(); testPoison(t, tr) })
	}
	if tr.Features.OrderedPerKey {
		t.Run("OrderedPerKey", func(t *testing.T) { t.Parallel(); testOrderedPerKey(t, tr) })
	}
	t.Run("DatabaseSQL", func(t *testing.T) {
		t.Parallel()
		t.Run("DuplicatesOneEffect", func(t *testing.T) { t.Parallel(); testSQLDuplicates(t, tr) })
		t.Run("FailingHandlerRolledBack", func(t *testing.T) { t.Parallel(); testSQLRollback(t, tr) })
	})
}

type env struct {
	db    *dbtest.DB
	inbox *dedupe.Inbox
	inst  Instance
}

func newEnv(t *testing.T, tr Transport, cfg dedupe.Config) *env {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 8})
	if err := dedupe.Migrate(context.Background(), db.Pool, cfg.Migration()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_id text NOT NULL, body bytea)`)
	inbox, err := dedupe.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{db: db, inbox: inbox, inst: tr.New(t, db)}
}

// newSQLEnv is newEnv with the inbox over database/sql: dedupe.SQL over
// pgx's stdlib, on the test's schema. (The test's pgx pool only counts.)
func newSQLEnv(t *testing.T, tr Transport, cfg dedupe.Config) *env {
	t.Helper()
	e := newEnv(t, tr, cfg)
	if e.inst.StartSQL == nil {
		t.Fatalf("transport %s has no StartSQL: every transport must serve an inbox over database/sql", tr.Name)
	}
	sqlDB, err := sql.Open("pgx", e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = sqlDB.Close() })
	if e.inbox, err = dedupe.New(dedupe.SQL(sqlDB), cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

func insertEffect(ctx context.Context, tx pgx.Tx, id string, body []byte) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_id, body) VALUES ($1, $2)", id, body)
	return err
}

// insertEffectSQL is insertEffect through a *sql.Tx.
func insertEffectSQL(ctx context.Context, tx *sql.Tx, id string, body []byte) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO effects (msg_id, body) VALUES ($1, $2)", id, body)
	return err
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	dbtest.WaitFor(t, d, what, cond)
}

func (e *env) start(t *testing.T, cfg RunConfig, effect Effect) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	return e.stopper(t, cancel, e.inst.Start(ctx, e.inbox, cfg, effect))
}

// startSQL is start with a *sql.Tx handler, for an inbox over dedupe.SQL.
func (e *env) startSQL(t *testing.T, cfg RunConfig, effect SQLEffect) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	return e.stopper(t, cancel, e.inst.StartSQL(ctx, e.inbox, cfg, effect))
}

// stopper returns the stop of a started consumer, also run at cleanup.
func (e *env) stopper(t *testing.T, cancel context.CancelFunc, wait func() error) (stop func()) {
	t.Helper()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := wait(); err != nil {
				t.Errorf("consumer stopped with: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (e *env) publish(t *testing.T, id string, body []byte) {
	t.Helper()
	if err := e.inst.Publish(context.Background(), id, body); err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
}

func (e *env) assertDrained(t *testing.T) {
	t.Helper()
	if e.inst.Unacked == nil {
		return
	}
	waitFor(t, 10*time.Second, "no unacknowledged messages", func() bool {
		n, err := e.inst.Unacked(context.Background())
		return err == nil && n <= 0
	})
}

func testDuplicates(t *testing.T, tr Transport) {
	e := newEnv(t, tr, dedupe.Config{})
	for range 5 {
		e.publish(t, "dup-1", []byte("pay 19.00"))
	}
	e.publish(t, "other", []byte("pay 1.00"))
	e.start(t, RunConfig{Workers: 4}, insertEffect)
	waitFor(t, 20*time.Second, "two effects", func() bool {
		return e.db.Count(t, "SELECT count(*) FROM effects") >= 2
	})
	e.assertDrained(t)
	if n := e.db.Count(t, "SELECT count(*) FROM effects WHERE msg_id = 'dup-1'"); n != 1 {
		t.Fatalf("effects of dup-1 = %d, want 1", n)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != 2 {
		t.Fatalf("effects = %d, want 2", n)
	}
}

func testFailThenSucceed(t *testing.T, tr Transport) {
	e := newEnv(t, tr, dedupe.Config{})
	var mu sync.Mutex
	calls := 0
	e.start(t, RunConfig{Workers: 2}, func(ctx context.Context, tx pgx.Tx, id string, body []byte) error {
		if err := insertEffect(ctx, tx, id, body); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 2 {
			return fmt.Errorf("transient failure %d", calls)
		}
		return nil
	})
	e.publish(t, "flaky", []byte("x"))
	waitFor(t, 30*time.Second, "the third attempt to commit", func() bool {
		return e.db.Count(t, "SELECT count(*) FROM effects") >= 1
	})
	e.assertDrained(t)
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	if n := e.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'flaky'"); n != 3 {
		t.Fatalf("attempts = %d, want 3", n)
	}
}

func testLoad(t *testing.T, tr Transport) {
	e := newEnv(t, tr, dedupe.Config{})
	const total, dupRate = 1000, 0.3
	rng := rand.New(rand.NewPCG(1, 2))
	var ids []string
	unique := map[string]bool{}
	for n := 0; len(ids) < total; n++ {
		id := fmt.Sprintf("m-%d", n)
		if len(ids) > 0 && rng.Float64() < dupRate {
			id = ids[rng.IntN(len(ids))]
		}
		ids = append(ids, id)
		unique[id] = true
	}
	stop := e.start(t, RunConfig{Workers: 4}, insertEffect)
	for _, id := range ids {
		e.publish(t, id, []byte(id))
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("%d effects", len(unique)), func() bool {
		return e.db.Count(t, "SELECT count(*) FROM effects") >= len(unique)
	})
	e.assertDrained(t)
	stop()
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != len(unique) {
		t.Fatalf("effects = %d, want %d unique of %d delivered", n, len(unique), total)
	}
	if n := e.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); n != len(unique) {
		t.Fatalf("distinct effects = %d, want %d", n, len(unique))
	}
}

func testPoison(t *testing.T, tr Transport) {
	e := newEnv(t, tr, dedupe.Config{})
	e.start(t, RunConfig{Workers: 2, MaxAttempts: 3}, func(ctx context.Context, tx pgx.Tx, id string, body []byte) error {
		if id == "poison" {
			return fmt.Errorf("cannot decode %q", body)
		}
		return insertEffect(ctx, tx, id, body)
	})
	e.publish(t, "poison", []byte("\x00garbage"))
	for n := range 20 {
		e.publish(t, fmt.Sprintf("ok-%d", n), []byte("fine"))
	}
	waitFor(t, 30*time.Second, "20 good effects and the poison key failed", func() bool {
		return e.db.Count(t, "SELECT count(*) FROM effects") >= 20 &&
			e.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'poison' AND state = 'failed'") == 1
	})
	e.assertDrained(t)
	if n := e.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'poison'"); n != 3 {
		t.Fatalf("poison attempts = %d, want 3", n)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != 20 {
		t.Fatalf("effects = %d, want 20", n)
	}
}

func testOrderedPerKey(t *testing.T, tr Transport) {
	e := newEnv(t, tr, dedupe.Config{})
	if e.inst.PublishOrdered == nil {
		t.Fatal("transport declares OrderedPerKey but has no PublishOrdered")
	}
	const perKey = 40
	orderKeys := []string{"account-1", "account-2", "account-3"}
	e.start(t, RunConfig{Workers: 4}, insertEffect)
	for n := range perKey {
		for _, ok := range orderKeys {
			id := fmt.Sprintf("%s/%03d", ok, n)
			if err := e.inst.PublishOrdered(context.Background(), ok, id, []byte(ok)); err != nil {
				t.Fatalf("publish %s: %v", id, err)
			}
		}
	}
	total := perKey * len(orderKeys)
	waitFor(t, 30*time.Second, fmt.Sprintf("%d effects", total), func() bool {
		return e.db.Count(t, "SELECT count(*) FROM effects") >= total
	})
	e.assertDrained(t)
	// effects.id is a sequence: the commit order of the effects.
	for _, ok := range orderKeys {
		rows, err := e.db.Pool.Query(context.Background(),
			"SELECT msg_id FROM effects WHERE body = $1 ORDER BY id", []byte(ok))
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != perKey {
			t.Fatalf("%s: %d effects, want %d", ok, len(got), perKey)
		}
		for n, id := range got {
			if want := fmt.Sprintf("%s/%03d", ok, n); id != want {
				t.Fatalf("%s: effect %d is %s, want %s (out of order)", ok, n, id, want)
			}
		}
	}
}

// testSQLDuplicates: with the inbox over database/sql and a *sql.Tx
// handler, copies of one message delivered together (published before the
// consumer starts, so that its workers take them at once) produce exactly
// one effect, written through the *sql.Tx. Each handler holds its claim a
// moment, so that the copies handled concurrently wait on it.
func testSQLDuplicates(t *testing.T, tr Transport) {
	e := newSQLEnv(t, tr, dedupe.Config{})
	for range 5 {
		e.publish(t, "dup-1", []byte("pay 19.00"))
	}
	e.publish(t, "other", []byte("pay 1.00"))
	e.startSQL(t, RunConfig{Workers: 4}, func(ctx context.Context, tx *sql.Tx, id string, body []byte) error {
		if _, err := tx.ExecContext(ctx, "SELECT pg_sleep(0.05)"); err != nil {
			return err
		}
		return insertEffectSQL(ctx, tx, id, body)
	})
	waitFor(t, 20*time.Second, "two effects", func() bool {
		return e.db.Count(t, "SELECT count(*) FROM effects") >= 2
	})
	e.assertDrained(t)
	if n := e.db.Count(t, "SELECT count(*) FROM effects WHERE msg_id = 'dup-1'"); n != 1 {
		t.Fatalf("effects of dup-1 = %d, want 1", n)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != 2 {
		t.Fatalf("effects = %d, want 2", n)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key IN ('dup-1', 'other') AND state = 'complete'"); n != 2 {
		t.Fatalf("complete keys = %d, want 2", n)
	}
}

// testSQLRollback: with the inbox over database/sql, the effect a failing
// *sql.Tx handler wrote rolls back with its claim: a message that fails
// twice and then succeeds leaves one effect after three attempts, and one
// whose handler fails for good (dedupe.Permanent) leaves none, its key
// failed.
func testSQLRollback(t *testing.T, tr Transport) {
	e := newSQLEnv(t, tr, dedupe.Config{})
	var mu sync.Mutex
	calls := 0
	e.startSQL(t, RunConfig{Workers: 2}, func(ctx context.Context, tx *sql.Tx, id string, body []byte) error {
		if err := insertEffectSQL(ctx, tx, id, body); err != nil {
			return err
		}
		if id == "doomed" {
			return dedupe.Permanent(fmt.Errorf("cannot decode %q", body))
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 2 {
			return fmt.Errorf("transient failure %d", calls)
		}
		return nil
	})
	e.publish(t, "flaky", []byte("x"))
	if tr.Features.Poison {
		e.publish(t, "doomed", []byte("\x00garbage"))
	}
	waitFor(t, 30*time.Second, "the third attempt to commit (and the doomed key failed)", func() bool {
		return e.db.Count(t, "SELECT count(*) FROM effects") >= 1 &&
			(!tr.Features.Poison || e.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'doomed' AND state = 'failed'") == 1)
	})
	e.assertDrained(t)
	if n := e.db.Count(t, "SELECT count(*) FROM effects WHERE msg_id = 'flaky'"); n != 1 {
		t.Fatalf("effects of flaky = %d, want 1", n)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != 1 {
		t.Fatalf("effects = %d, want 1 (the doomed handler's must roll back)", n)
	}
	if n := e.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'flaky' AND state = 'complete'"); n != 3 {
		t.Fatalf("attempts of the complete key flaky = %d, want 3", n)
	}
}
