package dedupetest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/dedupetest"
)

// fakeTB stands in for the testing.T of a user's test, to show that the kit
// fails the handlers it exists to catch: it records failures, and Fatal
// stops the calling goroutine as testing.T's does. Everything else (Cleanup,
// Logf) is the real test's.
type fakeTB struct {
	testing.TB
	deadline time.Time
	mu       sync.Mutex
	failures []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) record(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, s)
}

func (f *fakeTB) Error(args ...any)                 { f.record(fmt.Sprint(args...)) }
func (f *fakeTB) Errorf(format string, args ...any) { f.record(fmt.Sprintf(format, args...)) }
func (f *fakeTB) Fail()                             { f.record("Fail") }
func (f *fakeTB) Fatal(args ...any)                 { f.record(fmt.Sprint(args...)); runtime.Goexit() }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.record(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (f *fakeTB) FailNow() { f.record("FailNow"); runtime.Goexit() }
func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.failures) > 0
}

// Deadline is the user's test deadline, which bounds the kit's calls.
func (f *fakeTB) Deadline() (time.Time, bool) { return f.deadline, !f.deadline.IsZero() }

// runKit runs body as the body of a user's test with the given time left
// (none when 0) and returns the failures it recorded. It fails t if body
// does not end within a minute: the kit must fail, never hang.
func runKit(t *testing.T, left time.Duration, body func(tb testing.TB)) []string {
	t.Helper()
	f := &fakeTB{TB: t}
	if left > 0 {
		f.deadline = time.Now().Add(left)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		body(f)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the kit hung instead of failing the test")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failures
}

// wantFailure fails t unless one of failures contains every one of parts.
func wantFailure(t *testing.T, failures []string, parts ...string) {
	t.Helper()
	for _, f := range failures {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(f, p)
		}
		if all {
			return
		}
	}
	t.Fatalf("the kit's failures %q: none contains all of %q", failures, parts)
}

// consumerOf is a consumer of charges keyed by order id with handler h.
func consumerOf(t *testing.T, inbox *dedupe.Inbox, h dedupe.HandlerFunc[charge]) *dedupe.Consumer[charge] {
	t.Helper()
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[charge]{
		Scope: "billing",
		Key:   func(c charge) (string, error) { return c.OrderID, nil },
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// outsideTx is the mistake: it writes its effect through the pool, on a
// connection of its own, instead of the transaction it was given.
func outsideTx(env *dedupetest.Env) dedupe.HandlerFunc[charge] {
	return func(ctx context.Context, _ pgx.Tx, c charge) error {
		_, err := env.Pool.Exec(ctx, `INSERT INTO charges (order_id, cents) VALUES ($1, $2)`, c.OrderID, c.Cents)
		return err
	}
}

// TestKitFailsHandlerWaitingForSecondConnection: ten copies at once on a pool
// of eight, the handler writing through the pool: every connection holds a
// claim (or waits on the first one's) and the first waits for a ninth. The
// kit must fail, within the test's deadline, naming that cause (it hung
// until go test's -timeout before). The handler asks for its second
// connection only once the copies hold all eight: on a loaded machine the
// first copy could otherwise get one before the others took theirs, and
// finish.
func TestKitFailsHandlerWaitingForSecondConnection(t *testing.T) {
	t.Parallel()
	const conns = 8
	env := dedupetest.New(t, dedupetest.Options{MaxConns: conns, Setup: []string{chargesTable}})
	outside := outsideTx(env)
	c := consumerOf(t, env.Inbox, func(ctx context.Context, tx pgx.Tx, ch charge) error {
		for env.Pool.Stat().AcquiredConns() < conns {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		return outside(ctx, tx, ch)
	})
	started := time.Now()
	failures := runKit(t, 3*time.Second, func(tb testing.TB) {
		dedupetest.Deliver(tb, c, charge{OrderID: "o-1", Cents: 1}, 10)
	})
	wantFailure(t, failures, "Deliver", "second connection", "instead of the transaction it was given")
	t.Logf("failed after %s: %s", time.Since(started).Round(time.Millisecond), failures[0])
}

// TestKitFailsHandlerWritingOutsideItsTx: with connections to spare, the
// mistake shows when a commit fails: the effect committed on its own, the
// claim rolled back, and the redelivery runs the effect again.
func TestKitFailsHandlerWritingOutsideItsTx(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
	c := consumerOf(t, env.Inbox, outsideTx(env))
	failures := runKit(t, 0, func(tb testing.TB) {
		env.FailNextCommit(tb)
		dedupetest.UntilSettled(tb, c, charge{OrderID: "o-2", Cents: 1}, 5)
		env.WantCount(tb, 1, `SELECT count(*) FROM charges WHERE order_id = 'o-2'`)
	})
	wantFailure(t, failures, "= 2, want 1")
}

// TestKitFailsHandlerUnsafeUnderConcurrentDuplicates: a key that differs per
// delivery (an attempt id, a timestamp) lets every copy claim: the
// deliveries fired together all run the effect.
func TestKitFailsHandlerUnsafeUnderConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
	var attempt atomic.Int64
	c, err := dedupe.NewConsumer(env.Inbox, dedupe.ConsumerConfig[charge]{
		Scope: "billing",
		Key:   func(c charge) (string, error) { return fmt.Sprintf("%s/attempt-%d", c.OrderID, attempt.Add(1)), nil },
	}, chargeHandler)
	if err != nil {
		t.Fatal(err)
	}
	failures := runKit(t, 0, func(tb testing.TB) {
		dedupetest.Deliver(tb, c, charge{OrderID: "o-3", Cents: 1}, 6).ExactlyOnce(tb)
	})
	wantFailure(t, failures, "6 deliveries: 6 claimed, 0 duplicates, want 1 and 5")
	env.WantCount(t, 6, `SELECT count(*) FROM charges WHERE order_id = 'o-3'`)
}

// TestKitFailsHandlerEndingItsTx: a handler that commits or rolls back the
// transaction it was given.
func TestKitFailsHandlerEndingItsTx(t *testing.T) {
	t.Parallel()
	for name, end := range map[string]func(context.Context, pgx.Tx) error{
		"commits":    func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		"rolls back": func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		"ROLLBACK":   func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "ROLLBACK"); return err },
		"COMMIT":     func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT"); return err },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
			c := consumerOf(t, env.Inbox, func(ctx context.Context, tx pgx.Tx, ch charge) error {
				if err := chargeHandler(ctx, tx, ch); err != nil {
					return err
				}
				return end(ctx, tx)
			})
			failures := runKit(t, 0, func(tb testing.TB) {
				dedupetest.Deliver(tb, c, charge{OrderID: "o-4", Cents: 1}, 4).ExactlyOnce(tb)
			})
			wantFailure(t, failures, "4 deliveries:", "want 1 and 3")
		})
	}
}

// TestFailNextCommitTwiceFailsTwo: each call arms one failure (two calls
// armed one before).
func TestFailNextCommitTwiceFailsTwo(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
	c := newConsumer(t, env.Inbox)
	env.FailNextCommit(t)
	env.FailNextCommit(t)
	d := dedupetest.UntilSettled(t, c, charge{OrderID: "o-5", Cents: 1}, 5)
	if len(d.Outcomes) != 3 || d.Count(dedupe.OutcomeClaimed) != 1 {
		t.Fatalf("deliveries %s, want two failed commits and then a claim", d)
	}
	env.WantCount(t, 1, `SELECT count(*) FROM charges`)
	// Armed again after they fired: one more failure, for one transaction.
	env.FailNextCommit(t)
	d = dedupetest.UntilSettled(t, c, charge{OrderID: "o-6", Cents: 1}, 5)
	if len(d.Outcomes) != 2 || d.Count(dedupe.OutcomeClaimed) != 1 {
		t.Fatalf("deliveries %s, want one failed commit and then a claim", d)
	}
}

// TestFaultsHonourConfigSchema: FailNextCommit and ExpireLeases find an
// inbox in Config.Schema (they wrote to the Env's schema before).
func TestFaultsHonourConfigSchema(t *testing.T) {
	t.Parallel()
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "dtx_" + hex.EncodeToString(b[:])
	env := dedupetest.New(t, dedupetest.Options{Config: dedupe.Config{Schema: schema, Lease: time.Hour}, Setup: []string{chargesTable}})
	t.Cleanup(func() { env.Exec(t, "DROP SCHEMA "+schema+" CASCADE") })
	c := newConsumer(t, env.Inbox)
	env.FailNextCommit(t)
	d := dedupetest.UntilSettled(t, c, charge{OrderID: "o-7", Cents: 1}, 5)
	if len(d.Outcomes) != 2 || d.Count(dedupe.OutcomeClaimed) != 1 {
		t.Fatalf("deliveries %s, want one failed commit and then a claim", d)
	}
	env.RequireKey(t, dedupe.Key{Scope: "billing", ID: "o-7"}, dedupetest.KeyWant{State: dedupe.StateComplete, Attempts: 1})

	key := dedupe.Key{Scope: "jobs", ID: "k"}
	if cl, err := env.Inbox.Begin(context.Background(), key); err != nil || cl.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin = %v, %v", cl, err)
	}
	if n := env.ExpireLeases(t); n != 1 {
		t.Fatalf("ExpireLeases ended %d leases in schema %s, want 1", n, schema)
	}
}

// TestDeliverBoundsHandlerIgnoringItsContext: a handler that blocks without
// looking at its context fails the test after the bound and a grace period.
func TestDeliverBoundsHandlerIgnoringItsContext(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	c := consumerOf(t, env.Inbox, func(context.Context, pgx.Tx, charge) error {
		<-release
		return nil
	})
	failures := runKit(t, time.Second, func(tb testing.TB) {
		dedupetest.Deliver(tb, c, charge{OrderID: "o-8"}, 2)
	})
	wantFailure(t, failures, "Deliver: ", "of 2 deliveries still running", "likely cause", "ignores that context")
}

// TestRequireHelpers: the assertions pass on what is stored and fail, naming
// every difference, on what is not.
func TestRequireHelpers(t *testing.T) {
	t.Parallel()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{chargesTable}})
	ctx := context.Background()
	done := dedupe.Key{Scope: "http", ID: "req-1"}
	cl, err := env.Inbox.Begin(ctx, done)
	if err != nil {
		t.Fatal(err)
	}
	stored := dedupe.Result{Status: 201, Headers: map[string][]string{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}
	if err := env.Inbox.Complete(ctx, cl, stored); err != nil {
		t.Fatal(err)
	}
	poisoned := dedupe.Key{Scope: "http", ID: "req-2"}
	env.Poison(t, poisoned)
	absent := dedupe.Key{Scope: "http", ID: "req-3"}

	rec := env.RequireKey(t, done, dedupetest.KeyWant{State: dedupe.StateComplete, Attempts: 1, Result: &stored})
	if rec.Result.Status != 201 {
		t.Fatalf("record = %+v", rec)
	}
	env.RequireState(t, poisoned, dedupe.StateFailed)
	env.RequireAttempts(t, poisoned, 1)
	env.RequireResult(t, done, stored)
	env.RequireKey(t, poisoned, dedupetest.KeyWant{LastError: "poisoned"})
	env.RequireAbsent(t, absent)

	for _, tc := range []struct {
		name string
		call func(tb testing.TB)
		want []string
	}{
		{"state", func(tb testing.TB) { env.RequireState(tb, done, dedupe.StateFailed) }, []string{"http/req-1", "state complete, want failed"}},
		{"attempts", func(tb testing.TB) { env.RequireAttempts(tb, done, 2) }, []string{"attempts 1, want 2"}},
		{"result", func(tb testing.TB) {
			env.RequireResult(tb, done, dedupe.Result{Status: 201, Headers: stored.Headers, Body: []byte(`{"id":2}`)})
		}, []string{"result {status 201", `want {status 201`, `{\"id\":2}`}},
		{"no result", func(tb testing.TB) { env.RequireResult(tb, poisoned, stored) }, []string{"no stored result"}},
		{"several", func(tb testing.TB) {
			env.RequireKey(tb, poisoned, dedupetest.KeyWant{State: dedupe.StateComplete, Attempts: 3, LastError: "timeout"})
		}, []string{"state failed, want complete; attempts 1, want 3; last error"}},
		{"absent key", func(tb testing.TB) { env.RequireState(tb, absent, dedupe.StateComplete) }, []string{"http/req-3 is absent, want state complete"}},
		{"stored key", func(tb testing.TB) { env.RequireAbsent(tb, done) }, []string{"http/req-1 is stored (state complete, attempts 1)"}},
	} {
		wantFailure(t, runKit(t, 0, tc.call), tc.want...)
	}
}
