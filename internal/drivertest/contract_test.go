package drivertest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
	"github.com/exactlyonce/dedupe/outbox"
)

// bundle is one contract test's database: its own schema, the driver's DB
// on it, and the effects table handlers write to.
type bundle[TTx any] struct {
	k     kit[TTx]
	db    *dbtest.DB
	inbox dedupe.DB
	clock *dbtest.Clock
}

func setup[TTx any](t *testing.T, k kit[TTx]) *bundle[TTx] {
	t.Helper()
	db := dbtest.New(t)
	b := &bundle[TTx]{k: k, db: db, inbox: k.open(t, db.URL), clock: dbtest.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))}
	// The migration runs through the driver under test.
	if err := dedupe.Migrate(context.Background(), b.inbox, dedupe.MigrateConfig{Lines: dedupe.AllLines()}); err != nil {
		t.Fatalf("%s: migrate: %v", k.name, err)
	}
	db.Exec(t, `CREATE TABLE effects (key text NOT NULL)`)
	return b
}

// newInbox returns an inbox over db with the test's clock.
func (b *bundle[TTx]) newInbox(t *testing.T, db dedupe.DB, cfg dedupe.Config) *dedupe.Inbox {
	t.Helper()
	cfg.Clock = b.clock.Now
	cfg.Logger = dbtest.Logger(t)
	i, err := dedupe.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func (b *bundle[TTx]) effects(t *testing.T, key string) int {
	return b.db.Count(t, `SELECT count(*) FROM effects WHERE key = $1`, key)
}

// consumer returns a consumer of string messages (the message is its key)
// whose handler writes one effect through the driver's transaction, then
// returns what fail says.
func (b *bundle[TTx]) consumer(t *testing.T, inbox *dedupe.Inbox, cfg dedupe.ConsumerConfig[string], runs *atomic.Int64, fail func(key string) error) *dedupe.Consumer[string] {
	t.Helper()
	if cfg.Scope == "" {
		cfg.Scope = "orders"
	}
	cfg.Key = func(m string) (string, error) { return m, nil }
	c, err := dedupe.NewConsumer(inbox, cfg, func(ctx context.Context, tx TTx, key string) error {
		if runs != nil {
			runs.Add(1)
		}
		if err := b.k.exec(ctx, tx, `INSERT INTO effects (key) VALUES ($1)`, key); err != nil {
			return err
		}
		if fail != nil {
			return fail(key)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// contract is the core's contract, run against one driver.
func contract[TTx any](t *testing.T, k kit[TTx]) {
	t.Run("DuplicatesAtOnceCommitOneEffect", func(t *testing.T) {
		t.Parallel()
		b := setup(t, k)
		c := b.consumer(t, b.newInbox(t, b.inbox, dedupe.Config{}), dedupe.ConsumerConfig[string]{}, nil, nil)
		const keys, copies = 4, 8
		var claimed, dup atomic.Int64
		var mu sync.Mutex
		var errs []error
		dbtest.Together(keys*copies, func(i int) {
			out, err := c.Handle(context.Background(), fmt.Sprintf("k-%d", i%keys))
			switch {
			case err != nil:
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			case out == dedupe.OutcomeClaimed:
				claimed.Add(1)
			case out == dedupe.OutcomeDuplicate:
				dup.Add(1)
			}
		})
		if len(errs) > 0 {
			t.Fatalf("%d handlings failed, first: %v", len(errs), errs[0])
		}
		if claimed.Load() != keys || dup.Load() != keys*(copies-1) {
			t.Fatalf("claimed %d, duplicates %d; want %d and %d", claimed.Load(), dup.Load(), keys, keys*(copies-1))
		}
		for n := range keys {
			if got := b.effects(t, fmt.Sprintf("k-%d", n)); got != 1 {
				t.Fatalf("k-%d: %d effects, want 1", n, got)
			}
		}
	})

	t.Run("FailedHandlerLeavesNoClaimAndNoEffect", func(t *testing.T) {
		t.Parallel()
		b := setup(t, k)
		inbox := b.newInbox(t, b.inbox, dedupe.Config{})
		boom := errors.New("downstream unavailable")
		var failing atomic.Bool
		failing.Store(true)
		c := b.consumer(t, inbox, dedupe.ConsumerConfig[string]{}, nil, func(string) error {
			if failing.Load() {
				return boom
			}
			return nil
		})
		ctx := context.Background()
		out, err := c.Handle(ctx, "f-1")
		var he *dedupe.HandlerError
		if out != dedupe.OutcomeRetry || !errors.As(err, &he) || !errors.Is(err, boom) || !he.Recorded || he.Attempt != 1 {
			t.Fatalf("failing handle = %v, %v; want retry with the attempt recorded", out, err)
		}
		if got := b.effects(t, "f-1"); got != 0 {
			t.Fatalf("effects after a failed handler = %d, want 0", got)
		}
		rec, err := inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: "f-1"})
		if err != nil || rec.State == dedupe.StateComplete || rec.Attempts != 1 {
			t.Fatalf("record after a failed handler = %+v, %v; want not complete, 1 attempt", rec, err)
		}
		failing.Store(false)
		if out, err := c.Handle(ctx, "f-1"); out != dedupe.OutcomeClaimed || err != nil {
			t.Fatalf("redelivery = %v, %v; want claimed", out, err)
		}
		if got := b.effects(t, "f-1"); got != 1 {
			t.Fatalf("effects = %d, want 1", got)
		}
	})

	t.Run("FailedStatementInHandlerRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, k)
		inbox := b.newInbox(t, b.inbox, dedupe.Config{})
		c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{Scope: "orders", Key: func(m string) (string, error) { return m, nil }},
			func(ctx context.Context, tx TTx, key string) error {
				if err := k.exec(ctx, tx, `INSERT INTO effects (key) VALUES ($1)`, key); err != nil {
					return err
				}
				return k.exec(ctx, tx, `INSERT INTO no_such_table VALUES (1)`)
			})
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.Handle(context.Background(), "s-1")
		if out != dedupe.OutcomeRetry || err == nil {
			t.Fatalf("handle = %v, %v; want retry", out, err)
		}
		if got := b.effects(t, "s-1"); got != 0 {
			t.Fatalf("effects = %d, want 0", got)
		}
		rec, err := inbox.Lookup(context.Background(), dedupe.Key{Scope: "orders", ID: "s-1"})
		if err != nil || rec.Attempts != 1 || rec.State == dedupe.StateComplete {
			t.Fatalf("record = %+v, %v; want the attempt counted, not complete", rec, err)
		}
	})

	t.Run("HandlerSwallowingAFailedStatementFails", func(t *testing.T) {
		t.Parallel()
		swallowing(t, k)
	})

	t.Run("Batches", func(t *testing.T) {
		t.Parallel()
		batches(t, k)
	})

	t.Run("AttemptLimitHoldsUnderConcurrentDuplicates", func(t *testing.T) {
		t.Parallel()
		b := setup(t, k)
		const limit = 3
		var runs atomic.Int64
		c := b.consumer(t, b.newInbox(t, b.inbox, dedupe.Config{MaxAttempts: limit}), dedupe.ConsumerConfig[string]{}, &runs,
			func(string) error { return errors.New("always fails") })
		var poisoned atomic.Int64
		for range 4 {
			dbtest.Together(6, func(int) {
				if out, _ := c.Handle(context.Background(), "p-1"); out == dedupe.OutcomePoisoned {
					poisoned.Add(1)
				}
			})
		}
		if runs.Load() != limit {
			t.Fatalf("handler ran %d times, want exactly %d", runs.Load(), limit)
		}
		if poisoned.Load() == 0 {
			t.Fatal("no handling reported the key poisoned")
		}
		if got := b.effects(t, "p-1"); got != 0 {
			t.Fatalf("effects = %d, want 0", got)
		}
	})

	t.Run("HandleClassifiesAnExistingKey", func(t *testing.T) {
		// Every state a redelivery can find its key in, read behind the claim
		// that found it taken (in its round trip over pgx, after it over
		// database/sql): only a key nobody holds any more runs the handler.
		// (Without that read the claim's fallback, the takeover upsert and a
		// lookup, classifies the same at two round trips more: cmd/bench's
		// tiny run counts the round trips of a duplicate at the socket.)
		t.Parallel()
		b := setup(t, k)
		inbox := b.newInbox(t, b.inbox, dedupe.Config{Lease: 30 * time.Second})
		ctx := context.Background()
		var runs atomic.Int64
		fp := func(v string) func(string) []byte { return func(string) []byte { return []byte(v) } }
		c := b.consumer(t, inbox, dedupe.ConsumerConfig[string]{Fingerprint: fp("a")}, &runs, func(key string) error {
			if key == "poison" {
				return dedupe.Permanent(errors.New("fails"))
			}
			return nil
		})
		other := b.consumer(t, inbox, dedupe.ConsumerConfig[string]{Fingerprint: fp("b")}, &runs, nil)
		for _, key := range []string{"done", "other-payload"} {
			if out, err := c.Handle(ctx, key); err != nil || out != dedupe.OutcomeClaimed {
				t.Fatalf("first handling of %s = %v, %v", key, out, err)
			}
		}
		if out, _ := c.Handle(ctx, "poison"); out != dedupe.OutcomePoisoned {
			t.Fatalf("first handling of poison = %v, want poisoned (a permanent error)", out)
		}
		if _, err := inbox.Begin(ctx, dedupe.Key{Scope: "orders", ID: "leased", Fingerprint: []byte("a")}); err != nil {
			t.Fatal(err)
		}
		runs.Store(0)
		for _, tc := range []struct {
			key  string
			c    *dedupe.Consumer[string]
			want dedupe.Outcome
			err  error
		}{
			{"done", c, dedupe.OutcomeDuplicate, nil},
			{"other-payload", other, dedupe.OutcomeConflict, dedupe.ErrConflict},
			{"poison", c, dedupe.OutcomePoisoned, dedupe.ErrPoisoned},
			{"leased", c, dedupe.OutcomeInFlight, dedupe.ErrInFlight},
		} {
			out, err := tc.c.Handle(ctx, tc.key)
			if out != tc.want || (tc.err == nil && err != nil) || (tc.err != nil && !errors.Is(err, tc.err)) {
				t.Errorf("redelivery of %s = %v, %v; want %v, %v", tc.key, out, err, tc.want, tc.err)
			}
		}
		if n := runs.Load(); n != 0 {
			t.Fatalf("the handler ran %d times for keys that exist, want 0", n)
		}
		// The lease ends (its holder died): the redelivery takes the key over.
		b.clock.Advance(31 * time.Second)
		if out, err := c.Handle(ctx, "leased"); err != nil || out != dedupe.OutcomeClaimed {
			t.Fatalf("redelivery after the lease ended = %v, %v; want claimed", out, err)
		}
		if got := b.effects(t, "leased"); got != 1 || runs.Load() != 1 {
			t.Fatalf("effects = %d, runs = %d after the takeover; want 1, 1", got, runs.Load())
		}
	})

	t.Run("LeaseFencingAndTakeover", func(t *testing.T) {
		t.Parallel()
		b := setup(t, k)
		inbox := b.newInbox(t, b.inbox, dedupe.Config{Lease: 30 * time.Second})
		ctx := context.Background()
		key := dedupe.Key{Scope: "jobs", ID: "l-1"}
		first, err := inbox.Begin(ctx, key)
		if err != nil || first.Outcome != dedupe.OutcomeClaimed {
			t.Fatalf("begin = %+v, %v", first, err)
		}
		if c, err := inbox.Begin(ctx, key); !errors.Is(err, dedupe.ErrInFlight) && (err != nil || c.Outcome != dedupe.OutcomeInFlight) {
			t.Fatalf("begin under a live lease = %+v, %v; want in flight", c, err)
		}
		b.clock.Advance(31 * time.Second)
		second, err := inbox.Begin(ctx, key)
		if err != nil || second.Outcome != dedupe.OutcomeClaimed || second.Token == first.Token || second.Attempt != 2 {
			t.Fatalf("begin after the lease expired = %+v, %v; want a takeover, attempt 2", second, err)
		}
		if err := inbox.Complete(ctx, first, dedupe.Result{}); !errors.Is(err, dedupe.ErrLeaseLost) {
			t.Fatalf("late completion of the first holder = %v, want ErrLeaseLost", err)
		}
		if err := inbox.Complete(ctx, second, dedupe.Result{Status: 201, Body: []byte("ok")}); err != nil {
			t.Fatal(err)
		}
		dup, err := inbox.Begin(ctx, key)
		if err != nil || dup.Outcome != dedupe.OutcomeDuplicate || dup.Result == nil || dup.Result.Status != 201 || string(dup.Result.Body) != "ok" {
			t.Fatalf("begin after completion = %+v, %v; want a duplicate with the stored result", dup, err)
		}
		if left := second.LeaseLeft(); left <= 0 || left > 30*time.Second {
			t.Fatalf("lease left = %v, want within (0, 30s]", left)
		}
		// Intervals of days and fractions of a second read back whole.
		long := b.newInbox(t, b.inbox, dedupe.Config{Lease: 49*time.Hour + 1500*time.Millisecond})
		c, err := long.Begin(ctx, dedupe.Key{Scope: "jobs", ID: "l-2"})
		if err != nil {
			t.Fatal(err)
		}
		if left := c.LeaseLeft(); left <= 49*time.Hour || left > 49*time.Hour+1500*time.Millisecond {
			t.Fatalf("lease left = %v, want within (49h, 49h1.5s]", left)
		}
	})

	// A lost COMMIT reply, and a COMMIT answered before the backend ended
	// the connection with FATAL 57P01 (terminated between its answer and
	// ReadyForQuery, so the driver reports a server error for a COMMIT that
	// applied): neither is a rollback. The claim is resolved, and reported
	// claimed.
	for _, fault := range []struct {
		name   string
		action pgproxy.Action
	}{
		{"LostCommitReplyIsResolvedAsCommitted", pgproxy.DropReply},
		{"FatalAfterCommitIsResolvedAsCommitted", pgproxy.FatalAfterReply},
	} {
		t.Run(fault.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, k)
			u, p := dbtest.ProxyURL(t, b.db.URL, pgproxy.Once(fault.action, pgproxy.IsCommit))
			c := b.consumer(t, b.newInbox(t, k.open(t, u), dedupe.Config{}), dedupe.ConsumerConfig[string]{}, nil, nil)
			ctx := context.Background()
			out, err := c.Handle(ctx, "lost-1")
			if err != nil || out != dedupe.OutcomeClaimed {
				t.Fatalf("handle with the commit's answer faulted = %v, %v; want claimed", out, err)
			}
			if got := p.Stats().Of(fault.action); got != 1 {
				t.Fatalf("the proxy faulted %d commits, want 1", got)
			}
			if got := b.effects(t, "lost-1"); got != 1 {
				t.Fatalf("effects = %d, want 1", got)
			}
			if out, err := c.Handle(ctx, "lost-1"); err != nil || out != dedupe.OutcomeDuplicate {
				t.Fatalf("redelivery = %v, %v; want duplicate", out, err)
			}
		})
	}

	t.Run("CommitNeverSentIsNotACommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, k)
		p := startProxy(t, b.db.URL, pgproxy.Once(pgproxy.Cut, pgproxy.IsCommit))
		c := b.consumer(t, b.newInbox(t, k.open(t, p), dedupe.Config{}), dedupe.ConsumerConfig[string]{}, nil, nil)
		ctx := context.Background()
		out, err := c.Handle(ctx, "cut-1")
		if err == nil || out == dedupe.OutcomeClaimed || errors.Is(err, dedupe.ErrOutcomeUnknown) {
			t.Fatalf("handle with the commit cut = %v, %v; want a plain failure", out, err)
		}
		if got := b.effects(t, "cut-1"); got != 0 {
			t.Fatalf("effects = %d, want 0", got)
		}
		if out, err := c.Handle(ctx, "cut-1"); err != nil || out != dedupe.OutcomeClaimed {
			t.Fatalf("redelivery = %v, %v; want claimed", out, err)
		}
		if got := b.effects(t, "cut-1"); got != 1 {
			t.Fatalf("effects = %d, want 1", got)
		}
	})

	t.Run("RefusedConnectionIsNoOutcome", func(t *testing.T) {
		// A server that refuses the connection (here: an unknown database;
		// too many clients or a server starting up look the same) answered
		// before anything was sent: a plain error, never an outcome unknown,
		// and the request is not sent again as if its reply were lost.
		t.Parallel()
		b := setup(t, k)
		u, err := url.Parse(b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/dedupe_no_such_database"
		var log dbtest.Buffer
		inbox, err := dedupe.New(k.open(t, u.String()), dedupe.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := inbox.Begin(ctx, dedupe.Key{Scope: "jobs", ID: "r-1"}); err == nil || errors.Is(err, dedupe.ErrOutcomeUnknown) {
			t.Fatalf("begin on a refused connection = %v; want a plain error", err)
		}
		c := b.consumer(t, inbox, dedupe.ConsumerConfig[string]{}, nil, nil)
		if out, err := c.Handle(ctx, "r-2"); err == nil || out == dedupe.OutcomeUnknown || errors.Is(err, dedupe.ErrOutcomeUnknown) {
			t.Fatalf("handle on a refused connection = %v, %v; want a plain error", out, err)
		}
		if logged := log.String(); strings.Contains(logged, "connection lost under a statement") {
			t.Fatalf("a refused connection was taken for a lost reply:\n%s", logged)
		}
	})

	t.Run("ErrorsAreClassified", func(t *testing.T) {
		t.Parallel()
		b := setup(t, k)
		inbox := b.newInbox(t, b.inbox, dedupe.Config{})
		ctx := context.Background()
		for _, tc := range []struct {
			code string
			want error
		}{{"40001", dedupe.ErrRetryable}, {"40P01", dedupe.ErrRetryable}} {
			var runs atomic.Int64
			c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{Scope: "errs", Key: func(m string) (string, error) { return m, nil }, TxRetries: 2},
				func(ctx context.Context, tx TTx, key string) error {
					runs.Add(1)
					return k.exec(ctx, tx, fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '%s'; END $$`, tc.code))
				})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Handle(ctx, "e-"+tc.code); !errors.Is(err, tc.want) {
				t.Fatalf("SQLSTATE %s: err = %v, want %v", tc.code, err, tc.want)
			}
			if runs.Load() != 3 {
				t.Fatalf("SQLSTATE %s: handler ran %d times, want 3 (the transaction run again TxRetries times)", tc.code, runs.Load())
			}
		}

		// A lock timeout while a concurrent transaction holds the key is
		// reported in flight.
		tx, err := k.begin(ctx, b.inbox)
		if err != nil {
			t.Fatal(err)
		}
		defer k.rollback(ctx, tx) //nolint:errcheck // ended below
		held, err := inbox.Claim(ctx, k.querier(tx), dedupe.Key{Scope: "orders", ID: "held"})
		if err != nil || held.Outcome != dedupe.OutcomeClaimed {
			t.Fatalf("claim in the caller's transaction = %+v, %v", held, err)
		}
		c := b.consumer(t, inbox, dedupe.ConsumerConfig[string]{LockTimeout: 50 * time.Millisecond}, nil, nil)
		if out, err := c.Handle(ctx, "held"); out != dedupe.OutcomeInFlight || !errors.Is(err, dedupe.ErrInFlight) {
			t.Fatalf("handle of a key held elsewhere = %v, %v; want in flight", out, err)
		}
		if err := k.rollback(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if out, err := c.Handle(ctx, "held"); out != dedupe.OutcomeClaimed || err != nil {
			t.Fatalf("handle after the holder rolled back = %v, %v; want claimed", out, err)
		}
	})

	t.Run("CallersTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, k)
		inbox := b.newInbox(t, b.inbox, dedupe.Config{})
		ob, err := outbox.New(b.inbox, outbox.Config{Logger: dbtest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		// IDs that an array literal must quote (database/sql sends arrays
		// as text), and fingerprints in bytea arrays.
		odd := `a "quoted", {braced} \\back\\slash NULL`
		keys := []dedupe.Key{{Scope: "b", ID: odd, Fingerprint: []byte{0, 1, 255}}, {Scope: "b", ID: "NULL"}, {Scope: "b", ID: odd, Fingerprint: []byte{0, 1, 255}}}
		tx, err := k.begin(ctx, b.inbox)
		if err != nil {
			t.Fatal(err)
		}
		claims, err := inbox.ClaimBatch(ctx, k.querier(tx), keys)
		if err != nil {
			t.Fatal(err)
		}
		if claims[0].Outcome != dedupe.OutcomeClaimed || claims[1].Outcome != dedupe.OutcomeClaimed || claims[2].Outcome != dedupe.OutcomeDuplicate {
			t.Fatalf("batch outcomes = %v %v %v", claims[0].Outcome, claims[1].Outcome, claims[2].Outcome)
		}
		if err := inbox.StoreResultTx(ctx, k.querier(tx), claims[0], dedupe.Result{Status: 200, Headers: map[string][]string{"A": {"b"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Enqueue(ctx, k.querier(tx), outbox.Message{Topic: "t", Key: "k", Payload: []byte("p")}); err != nil {
			t.Fatal(err)
		}
		if err := k.commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		tx, err = k.begin(ctx, b.inbox)
		if err != nil {
			t.Fatal(err)
		}
		c, err := inbox.Claim(ctx, k.querier(tx), dedupe.Key{Scope: "b", ID: odd, Fingerprint: []byte{0, 1, 255}})
		if err != nil || c.Outcome != dedupe.OutcomeDuplicate || c.Result == nil || c.Result.Status != 200 || c.Result.Headers["A"][0] != "b" {
			t.Fatalf("claim of a committed key = %+v, %v; want a duplicate with its result", c, err)
		}
		other, err := inbox.Claim(ctx, k.querier(tx), dedupe.Key{Scope: "b", ID: odd, Fingerprint: []byte{2}})
		if err != nil || other.Outcome != dedupe.OutcomeConflict {
			t.Fatalf("claim with another fingerprint = %+v, %v; want a conflict", other, err)
		}
		_ = k.rollback(ctx, tx)

		// The relay publishes through the same driver (polling where it
		// cannot LISTEN).
		var published atomic.Int64
		relay, err := outbox.NewRelay(ob, outbox.PublishFunc(func(_ context.Context, m *outbox.StoredMessage) error {
			published.Add(1)
			return nil
		}), outbox.RelayConfig{Logger: dbtest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := relay.Cycle(ctx); err != nil || n != 1 || published.Load() != 1 {
			t.Fatalf("relay cycle = %d, %v (published %d); want 1", n, err, published.Load())
		}
	})
}

// startProxy starts a fault proxy in front of the test's server and
// returns the URL through it.
func startProxy(t *testing.T, url string, policy pgproxy.Policy) string {
	t.Helper()
	u, _ := dbtest.ProxyURL(t, url, policy)
	return u
}

// swallowing is a contract test added to each driver's run: a handler whose
// statement failed but that returned nil is a failed attempt, counted, its
// effects rolled back; never reported processed.
func swallowing[TTx any](t *testing.T, k kit[TTx]) {
	t.Helper()
	b := setup(t, k)
	inbox := b.newInbox(t, b.inbox, dedupe.Config{MaxAttempts: 2})
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{Scope: "orders", Key: func(m string) (string, error) { return m, nil }},
		func(ctx context.Context, tx TTx, key string) error {
			if err := k.exec(ctx, tx, `INSERT INTO effects (key) VALUES ($1)`, key); err != nil {
				return err
			}
			_ = k.exec(ctx, tx, `INSERT INTO no_such_table VALUES (1)`) // the careless handler
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out, err := c.Handle(ctx, "sw-1")
	if out != dedupe.OutcomeRetry || !errors.Is(err, dedupe.ErrTxEnded) {
		t.Fatalf("handle = %v, %v; want retry with ErrTxEnded", out, err)
	}
	if out, err := c.Handle(ctx, "sw-1"); out != dedupe.OutcomePoisoned || !errors.Is(err, dedupe.ErrPoisoned) {
		t.Fatalf("second attempt = %v, %v; want poisoned (MaxAttempts 2)", out, err)
	}
	if got := b.effects(t, "sw-1"); got != 0 {
		t.Fatalf("effects = %d, want 0", got)
	}
}

// batches is the BatchConsumer's part of the contract: batches of the same
// keys at once commit one effect per key, and a handler that swallows a
// failed statement fails its message alone, the ones before it committed
// and the ones after it left for redelivery.
func batches[TTx any](t *testing.T, k kit[TTx]) {
	t.Helper()
	b := setup(t, k)
	inbox := b.newInbox(t, b.inbox, dedupe.Config{})
	cfg := dedupe.ConsumerConfig[string]{Scope: "batch", Key: func(m string) (string, error) { return m, nil }}
	bc, err := dedupe.NewBatchConsumer(inbox, cfg, func(ctx context.Context, tx TTx, key string) error {
		if err := k.exec(ctx, tx, `INSERT INTO effects (key) VALUES ($1)`, key); err != nil {
			return err
		}
		if key == "careless" {
			_ = k.exec(ctx, tx, `INSERT INTO no_such_table VALUES (1)`)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var failures atomic.Int64
	dbtest.Together(6, func(int) {
		for _, r := range bc.HandleBatch(ctx, []string{"b-1", "b-2", "b-3", "b-2"}) {
			if r.Err != nil {
				failures.Add(1)
			}
		}
	})
	if failures.Load() != 0 {
		t.Fatalf("%d messages of concurrent batches failed", failures.Load())
	}
	for _, key := range []string{"b-1", "b-2", "b-3"} {
		if got := b.effects(t, key); got != 1 {
			t.Fatalf("%s: %d effects, want 1", key, got)
		}
	}
	res := bc.HandleBatch(ctx, []string{"c-1", "careless", "c-2"})
	if res[0].Outcome != dedupe.OutcomeClaimed || res[0].Err != nil {
		t.Fatalf("message before the careless one = %+v, want claimed", res[0])
	}
	if res[1].Outcome != dedupe.OutcomeRetry || !errors.Is(res[1].Err, dedupe.ErrTxEnded) {
		t.Fatalf("careless message = %+v, want retry with ErrTxEnded", res[1])
	}
	if !errors.Is(res[2].Err, dedupe.ErrNotAttempted) {
		t.Fatalf("message after the careless one = %+v, want ErrNotAttempted", res[2])
	}
	for key, want := range map[string]int{"c-1": 1, "careless": 0, "c-2": 0} {
		if got := b.effects(t, key); got != want {
			t.Fatalf("%s: %d effects, want %d", key, got, want)
		}
	}
}
