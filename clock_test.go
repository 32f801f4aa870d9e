package dedupe_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestPoolStarvedBeginReturnsLiveLease: a Begin that waits for a pool
// connection longer than the lease still returns a live lease, because the
// lease is computed by the database when the statement runs, not from a
// reading taken before the wait. (Computed up front, it came back already
// expired and a second holder took the key at once.)
func TestPoolStarvedBeginReturnsLiveLease(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	starved := db.AppPool(t, "starved", 1)
	// The lease must outlive the steps from the claim to the second Begin
	// below on a loaded machine; the pool wait must outlast it.
	const lease = 2 * time.Second
	inbox, err := dedupe.New(starved, dedupe.Config{Lease: lease, Logger: dbtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	other, err := dedupe.New(db.Pool, dedupe.Config{Lease: lease, Logger: dbtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	// Hold the only connection for longer than a lease.
	held, err := starved.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var (
		c    *dedupe.Claim
		berr error
		wg   sync.WaitGroup
	)
	wg.Go(func() { c, berr = inbox.Begin(ctx, dedupe.Key{Scope: "jobs", ID: "starved"}) })
	time.Sleep(lease + time.Second) // timing is the feature: the wait must outlast the lease
	held.Release()
	wg.Wait()
	if berr != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin = %+v, %v", c, berr)
	}
	if c.LeaseLeft() <= 0 {
		t.Fatalf("begin returned a lease with %v left", c.LeaseLeft())
	}
	// Right away, another process must find the key held.
	d, err := other.Begin(ctx, dedupe.Key{Scope: "jobs", ID: "starved"})
	if err != nil || d.Outcome != dedupe.OutcomeInFlight {
		t.Fatalf("second holder = %+v, %v; want in flight", d, err)
	}
	if err := inbox.Complete(ctx, c, dedupe.Result{Status: 1}); err != nil {
		t.Fatalf("complete = %v", err)
	}
}

// recordingDB records the arguments of every statement the inbox sends.
type recordingDB struct {
	*pgxpool.Pool
	mu   sync.Mutex
	args [][]any
}

func (r *recordingDB) note(args []any) {
	r.mu.Lock()
	r.args = append(r.args, args)
	r.mu.Unlock()
}

func (r *recordingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.note(args)
	return r.Pool.Exec(ctx, sql, args...)
}

func (r *recordingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.note(args)
	return r.Pool.Query(ctx, sql, args...)
}

func (r *recordingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r.note(args)
	return r.Pool.QueryRow(ctx, sql, args...)
}

func (r *recordingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		r.note(q.Arguments)
	}
	return r.Pool.SendBatch(ctx, b)
}

// TestNoApplicationTimeReachesTheDatabase: with no test clock set, not one
// statement of the leased and transactional paths, purge or stats carries a
// time read from the application: every lease, expiry and takeover is
// decided by the database's clock, so processes whose clocks disagree (by a
// whole lease, say) cannot both hold a key. Before, every claim sent
// time.Now() and its sums.
func TestNoApplicationTimeReachesTheDatabase(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	rec := &recordingDB{Pool: db.Pool}
	inbox, err := dedupe.New(rec, dedupe.Config{Logger: dbtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	key := dedupe.Key{Scope: "jobs", ID: "clockless"}
	c, err := inbox.Begin(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := inbox.Extend(ctx, c, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Fail(ctx, c, errors.New("try again")); err != nil {
		t.Fatal(err)
	}
	if c, err = inbox.Begin(ctx, key); err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("takeover = %+v, %v", c, err)
	}
	if err := inbox.Complete(ctx, c, dedupe.Result{}); err != nil {
		t.Fatal(err)
	}
	cons, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
		func(context.Context, pgx.Tx, order) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cons.Handle(ctx, order{ID: "o-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Purge(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Lookup(ctx, key); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.args) < 8 {
		t.Fatalf("recorded %d statements; the recorder missed the inbox's calls", len(rec.args))
	}
	for _, args := range rec.args {
		for _, a := range args {
			switch v := a.(type) {
			case time.Time:
				t.Errorf("a statement carried the application's time %v: %v", v, args)
			case *time.Time:
				if v != nil {
					t.Errorf("a statement carried the application's time %v: %v", *v, args)
				}
			}
		}
	}
}

// TestLeaseMeasuredOnTheDatabaseClock: the lease a claim reports is the
// database's, and LeaseLeft counts it down on this process's monotonic clock.
func TestLeaseMeasuredOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	inbox, err := dedupe.New(db.Pool, dedupe.Config{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c, err := inbox.Begin(ctx, dedupe.Key{Scope: "jobs", ID: "measured"})
	if err != nil {
		t.Fatal(err)
	}
	var serverNow time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&serverNow); err != nil {
		t.Fatal(err)
	}
	if d := c.LockedUntil.Sub(serverNow); d > time.Minute || d < 50*time.Second {
		t.Fatalf("locked until %v, the server's now + %v; want about a minute", c.LockedUntil, d)
	}
	if left := c.LeaseLeft(); left > time.Minute || left < 50*time.Second {
		t.Fatalf("lease left = %v, want about a minute", left)
	}
}
