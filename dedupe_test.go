package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestClaimCommitsAndRollsBackWithCallerTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "payments", ID: "evt_1"}

	// Rolled back: the claim goes with it.
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := b.inbox.Claim(ctx, tx, key); err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("claim = %+v, %v", c, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Lookup(ctx, key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("after rollback: %v, want ErrNotFound", err)
	}

	// Committed: later claims are duplicates.
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		c, err := b.inbox.Claim(ctx, tx, key)
		if err != nil || c.Outcome != dedupe.OutcomeClaimed {
			return fmt.Errorf("claim = %+v, %v", c, err)
		}
		_, err = tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", key.ID)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		c, err := b.inbox.Claim(ctx, tx, key)
		if err != nil || c.Outcome != dedupe.OutcomeDuplicate || c.Result == nil {
			return fmt.Errorf("second claim = %+v, %v; want duplicate", c, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.effects(t, key.ID); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

func TestClaimScopesAreIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, scope := range []string{"tenant-a", "tenant-b"} {
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			c, err := b.inbox.Claim(ctx, tx, dedupe.Key{Scope: scope, ID: "same-key"})
			if err != nil || c.Outcome != dedupe.OutcomeClaimed {
				return fmt.Errorf("scope %s: %+v, %v", scope, c, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	k := func(id string) dedupe.Key { return dedupe.Key{Scope: "topic", ID: id} }

	// Pre-existing: "b" complete, "c" failed-attempt (retryable), "d" poisoned.
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := b.inbox.ClaimBatch(ctx, tx, []dedupe.Key{k("b")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c, err := b.inbox.Begin(ctx, k("c"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Fail(ctx, c, errors.New("transient")); err != nil {
		t.Fatal(err)
	}
	d, err := b.inbox.Begin(ctx, k("d"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Fail(ctx, d, dedupe.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}

	keys := []dedupe.Key{k("z"), k("b"), k("a"), k("c"), k("a"), k("d")}
	var claims []*dedupe.Claim
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		claims, err = b.inbox.ClaimBatch(ctx, tx, keys)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := []dedupe.Outcome{dedupe.OutcomeClaimed, dedupe.OutcomeDuplicate, dedupe.OutcomeClaimed,
		dedupe.OutcomeClaimed, dedupe.OutcomeDuplicate, dedupe.OutcomePoisoned}
	for n, c := range claims {
		if c.Outcome != want[n] || c.Key.ID != keys[n].ID {
			t.Errorf("claims[%d] = %s %v, want %s %v", n, c.Key.ID, c.Outcome, keys[n].ID, want[n])
		}
	}
	if claims[3].Attempt != 2 {
		t.Errorf("retaken key attempt = %d, want 2", claims[3].Attempt)
	}
}

func TestClaimBatchConcurrentOverlapOneClaimEach(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const batches, size = 8, 50
	claimed := make([]int, batches)
	together(batches, func(w int) {
		keys := make([]dedupe.Key, size)
		for n := range keys {
			keys[n] = dedupe.Key{Scope: "topic", ID: fmt.Sprintf("m-%d", (n*7+w*13)%size)}
		}
		err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
			claims, err := b.inbox.ClaimBatch(context.Background(), tx, keys)
			if err != nil {
				return err
			}
			for _, c := range claims {
				if c.Outcome == dedupe.OutcomeClaimed {
					claimed[w]++
					if _, err := tx.Exec(context.Background(), "INSERT INTO effects (msg_key) VALUES ($1)", c.Key.ID); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("batch %d: %v", w, err)
		}
	})
	total := 0
	for _, n := range claimed {
		total += n
	}
	if total != size || b.db.Count(t, "SELECT count(*) FROM effects") != size {
		t.Fatalf("claimed %d, effects %d; want %d", total, b.db.Count(t, "SELECT count(*) FROM effects"), size)
	}
}

func TestNotMigratedError(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Begin(context.Background(), dedupe.Key{Scope: "s", ID: "k"}); !errors.Is(err, dedupe.ErrNotMigrated) {
		t.Fatalf("begin without migration: %v, want ErrNotMigrated", err)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	for name, cfg := range map[string]dedupe.Config{
		"negative lease":     {Lease: -1},
		"retention < lease":  {Lease: 2 * 60e9, Retention: 60e9},
		"negative batch":     {PurgeBatchSize: -5},
		"table name too big": {Table: string(make([]byte, 60))},
	} {
		var ce *dedupe.ConfigError
		if _, err := dedupe.New(db.Pool, cfg); !errors.As(err, &ce) || !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("%s: %v, want *ConfigError", name, err)
		}
	}
	if _, err := dedupe.New(nil, dedupe.Config{}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Errorf("nil db: %v", err)
	}
}

func TestStoreResultTxAndRecordFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, dedupe.Config{MaxAttempts: 2})
	ctx := context.Background()
	key := dedupe.Key{Scope: "topic", ID: "m-1"}

	// Two failed attempts recorded by an adapter that runs handlers itself.
	for want := 1; want <= 2; want++ {
		attempts, poisoned, err := b.inbox.RecordFailure(ctx, key, errors.New("boom"))
		if err != nil || attempts != want || poisoned != (want == 2) {
			t.Fatalf("record failure %d = %d, %v, %v", want, attempts, poisoned, err)
		}
	}
	other := dedupe.Key{Scope: "topic", ID: "m-2"}
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		claims, err := b.inbox.ClaimBatch(ctx, tx, []dedupe.Key{key, other})
		if err != nil {
			return err
		}
		if claims[0].Outcome != dedupe.OutcomePoisoned || claims[1].Outcome != dedupe.OutcomeClaimed {
			return fmt.Errorf("outcomes %v %v", claims[0].Outcome, claims[1].Outcome)
		}
		if err := b.inbox.StoreResultTx(ctx, tx, claims[0], dedupe.Result{}); !errors.Is(err, dedupe.ErrLeaseLost) {
			return fmt.Errorf("store on poisoned claim: %v", err)
		}
		return b.inbox.StoreResultTx(ctx, tx, claims[1], dedupe.Result{Status: 7, Body: []byte("done")})
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.inbox.Lookup(ctx, other)
	if err != nil || rec.Result == nil || rec.Result.Status != 7 || string(rec.Result.Body) != "done" {
		t.Fatalf("stored = %+v, %v", rec, err)
	}
	// A completed key is never touched by a late failure record.
	if attempts, poisoned, err := b.inbox.RecordFailure(ctx, other, errors.New("late")); err != nil || attempts != 0 || poisoned {
		t.Fatalf("late failure = %d, %v, %v", attempts, poisoned, err)
	}
}

// TestQueueStoreResultCommitsWithTheResult: concurrent deliveries of one
// key, each claiming in its own transaction; the one that claims sends the
// stored result and COMMIT in one batch on its connection. Exactly one
// effect commits, with the result, and every later delivery gets it back.
func TestQueueStoreResultCommitsWithTheResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "topic", ID: "m-1"}
	const n = 8
	outcomes := make([]dedupe.Outcome, n)
	errs := make([]error, n)
	together(n, func(i int) {
		errs[i] = func() error {
			conn, err := b.db.Pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck // ErrTxClosed once the batch committed
			claim, err := b.inbox.Claim(ctx, tx, key)
			if err != nil {
				return err
			}
			outcomes[i] = claim.Outcome
			if claim.Outcome != dedupe.OutcomeClaimed {
				return nil
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects (msg_key) VALUES ($1)`, key.ID); err != nil {
				return err
			}
			batch := &pgx.Batch{}
			if err := b.inbox.QueueStoreResult(batch, claim, dedupe.Result{Status: 201, Body: []byte("order 1")}); err != nil {
				return err
			}
			batch.Queue("COMMIT")
			if err := conn.SendBatch(ctx, batch).Close(); err != nil {
				return err
			}
			if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
				return fmt.Errorf("transaction status %c after the batch, want I (committed)", st)
			}
			return nil
		}()
	})
	claimed := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("delivery %d: %v", i, errs[i])
		}
		if outcomes[i] == dedupe.OutcomeClaimed {
			claimed++
		}
	}
	if claimed != 1 || b.effects(t, key.ID) != 1 {
		t.Fatalf("claimed %d, effects %d; want 1 and 1 (outcomes %v)", claimed, b.effects(t, key.ID), outcomes)
	}
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		claim, err := b.inbox.Claim(ctx, tx, key)
		if err != nil {
			return err
		}
		if claim.Outcome != dedupe.OutcomeDuplicate || claim.Result == nil || claim.Result.Status != 201 || string(claim.Result.Body) != "order 1" {
			return fmt.Errorf("redelivery = %v %+v, want a duplicate with the stored result", claim.Outcome, claim.Result)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.QueueStoreResult(&pgx.Batch{}, nil, dedupe.Result{}); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("QueueStoreResult without a claim = %v, want ErrLeaseLost", err)
	}
}

// TestQueueStoreResultFencesTheCommit: the COMMIT sent behind the queued
// statement must not commit the effects when the claim is not the
// transaction's. A leased claim is used by mistake (its lease ran out and
// another worker took the key over): the batch fails with ErrLeaseLost and
// the effect written before it is rolled back, where a plain UPDATE would
// have matched no row and let the COMMIT through.
func TestQueueStoreResultFencesTheCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := dedupe.Key{Scope: "topic", ID: "m-1"}
	stale, err := b.inbox.Begin(ctx, key)
	if err != nil || stale.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin = %v, %v", stale, err)
	}
	b.clock.Advance(dedupe.DefaultLease + time.Second)
	if taker, err := b.inbox.Begin(ctx, key); err != nil || taker.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("takeover = %v, %v", taker, err)
	}
	conn, err := b.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO effects (msg_key) VALUES ($1)`, key.ID); err != nil {
		t.Fatal(err)
	}
	batch := &pgx.Batch{}
	if err := b.inbox.QueueStoreResult(batch, stale, dedupe.Result{Status: 200}); err != nil {
		t.Fatal(err)
	}
	batch.Queue("COMMIT")
	err = conn.SendBatch(ctx, batch).Close()
	if !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("batch = %v, want ErrLeaseLost", err)
	}
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if got := b.effects(t, key.ID); got != 0 {
		t.Fatalf("effects = %d, want 0: the COMMIT behind the fenced statement committed them", got)
	}
}

func TestClaimBatchRepeatedKeyOtherFingerprintConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		claims, err := b.inbox.ClaimBatch(ctx, tx, []dedupe.Key{
			{Scope: "s", ID: "k", Fingerprint: []byte("a")},
			{Scope: "s", ID: "k", Fingerprint: []byte("a")},
			{Scope: "s", ID: "k", Fingerprint: []byte("b")},
		})
		if err != nil {
			return err
		}
		got := []dedupe.Outcome{claims[0].Outcome, claims[1].Outcome, claims[2].Outcome}
		want := []dedupe.Outcome{dedupe.OutcomeClaimed, dedupe.OutcomeDuplicate, dedupe.OutcomeConflict}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("outcomes %v, want %v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestClaimBatchRepeatsGetTheKeysOutcome: a key repeated in a batch gets,
// at every occurrence, the outcome Claim would give it: a poisoned key is
// poisoned and a key in a live lease is in flight, not "duplicate" (which
// would make a transport acknowledge a message that never ran).
func TestClaimBatchRepeatsGetTheKeysOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	k := func(id string) dedupe.Key { return dedupe.Key{Scope: "topic", ID: id} }
	poison, err := b.inbox.Begin(ctx, k("poison"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Fail(ctx, poison, dedupe.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Begin(ctx, k("held")); err != nil { // a live lease
		t.Fatal(err)
	}
	done, err := b.inbox.Begin(ctx, k("done"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.Complete(ctx, done, dedupe.Result{Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	keys := []dedupe.Key{k("poison"), k("poison"), k("held"), k("held"), k("done"), k("done"), k("new"), k("new")}
	var claims []*dedupe.Claim
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		claims, err = b.inbox.ClaimBatch(ctx, tx, keys)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := []dedupe.Outcome{dedupe.OutcomePoisoned, dedupe.OutcomePoisoned, dedupe.OutcomeInFlight, dedupe.OutcomeInFlight,
		dedupe.OutcomeDuplicate, dedupe.OutcomeDuplicate, dedupe.OutcomeClaimed, dedupe.OutcomeDuplicate}
	for n, c := range claims {
		if c.Outcome != want[n] {
			t.Errorf("claims[%d] (%s) = %v, want %v", n, keys[n].ID, c.Outcome, want[n])
		}
	}
	if r := claims[5].Result; r == nil || string(r.Body) != "r" {
		t.Errorf("repeated duplicate's result = %+v, want the stored one", r)
	}
}

// TestClaimReadsAnExistingKeyWithTheClaimOnlyAfterDuplicates: over pgx,
// Inbox.Claim sends the read of an existing key in the claim's batch only
// while one of the inbox's last 64 claims found its key taken; otherwise a
// new key sends no read and a key found taken is read after the batch, by
// that read alone (no takeover statement). Either way every claim gets its
// outcome, a duplicate with its stored result.
func TestClaimReadsAnExistingKeyWithTheClaimOnlyAfterDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reads := &readTracer{}
	pool := directPoolAt(t, b.db.URL, 2, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = reads })
	inbox := newInbox(t, pool, b)
	ctx := context.Background()
	for _, st := range peekWindowSteps() {
		reads.reset()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			c, err := inbox.Claim(ctx, tx, dedupe.Key{Scope: "orders", ID: st.id})
			if err != nil {
				return err
			}
			if c.Outcome != st.out {
				return fmt.Errorf("claim = %+v, want %v", c, st.out)
			}
			if c.Outcome == dedupe.OutcomeClaimed {
				return inbox.StoreResultTx(ctx, tx, c, dedupe.Result{Status: 201, Body: []byte(st.id)})
			}
			if c.Result.Status != 201 || string(c.Result.Body) != st.id {
				return fmt.Errorf("duplicate's result = %d %q, want 201 %q", c.Result.Status, c.Result.Body, st.id)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s (%s): %v", st.what, st.id, err)
		}
		if got := reads.where(); got != st.peek {
			t.Fatalf("%s (%s): read %q, want %q", st.what, st.id, got, st.peek)
		}
	}
}

// readTracer records where the inbox's read of a key (its SQL begins with
// "SELECT scope") ran: in a batch ("in round") or as a statement of its own
// ("after"); and any INSERT sent on its own ("insert after": a takeover).
type readTracer struct {
	dbtest.NopTracer
	mu   sync.Mutex
	seen []string
}

func isRead(sql string) bool { return strings.HasPrefix(strings.TrimSpace(sql), "SELECT scope") }

func (r *readTracer) add(where string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, where)
}

func (r *readTracer) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = nil
}

// where returns where the one read since reset ran, "" for none.
func (r *readTracer) where() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.seen, ",")
}

func (r *readTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	switch {
	case isRead(d.SQL):
		r.add("after")
	case strings.HasPrefix(strings.TrimSpace(d.SQL), "INSERT"):
		r.add("insert after")
	}
	return ctx
}

func (r *readTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if isRead(d.SQL) {
		r.add("in round")
	}
}

// TestClaimConcurrentDuplicatesAtEveryIsolationLevel: deliveries of one key
// claimed at the same instant, on an inbox that has met no duplicate yet (so
// the claims that find the key taken read it after their batch), in READ
// COMMITTED, REPEATABLE READ and SERIALIZABLE transactions: exactly one
// effect, one claim, and every other delivery a duplicate with the stored
// result, after retrying the serialization failures the stricter levels
// raise (ErrRetryable).
func TestClaimConcurrentDuplicatesAtEveryIsolationLevel(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			inbox := newInbox(t, b.db.Pool, b)
			ctx := context.Background()
			key := dedupe.Key{Scope: "orders", ID: "o-iso"}
			const n, tries = 8, 20
			outcomes := make([]dedupe.Outcome, n)
			errs := make([]error, n)
			together(n, func(i int) {
				for try := 0; try < tries; try++ {
					errs[i] = pgx.BeginTxFunc(ctx, b.db.Pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
						c, err := inbox.Claim(ctx, tx, key)
						if err != nil {
							return err
						}
						outcomes[i] = c.Outcome
						switch c.Outcome {
						case dedupe.OutcomeClaimed:
							if _, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", key.ID); err != nil {
								return err
							}
							return inbox.StoreResultTx(ctx, tx, c, dedupe.Result{Status: 201, Body: []byte("done")})
						case dedupe.OutcomeDuplicate:
							if c.Result.Status != 201 || string(c.Result.Body) != "done" {
								return fmt.Errorf("duplicate's result = %d %q, want 201 \"done\"", c.Result.Status, c.Result.Body)
							}
						}
						return nil
					})
					if !errors.Is(errs[i], dedupe.ErrRetryable) {
						return
					}
				}
			})
			claimed, dups := 0, 0
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("delivery %d: %v", i, errs[i])
				}
				switch outcomes[i] {
				case dedupe.OutcomeClaimed:
					claimed++
				case dedupe.OutcomeDuplicate:
					dups++
				}
			}
			if claimed != 1 || dups != n-1 || b.effects(t, key.ID) != 1 {
				t.Fatalf("claimed %d, duplicates %d, effects %d; want 1, %d, 1 (outcomes %v)", claimed, dups, b.effects(t, key.ID), n-1, outcomes)
			}
		})
	}
}
