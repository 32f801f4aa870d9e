package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// order is the message type of these tests.
type order struct {
	ID    string
	Total int
}

func orderKey(o order) (string, error) { return o.ID, nil }

// insertEffect is the handler's effect: one row per processed message.
func insertEffect(ctx context.Context, tx pgx.Tx, o order) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", o.ID)
	return err
}

func newConsumer(t *testing.T, b *bundle, cfg dedupe.ConsumerConfig[order], h dedupe.HandlerFunc[order]) *dedupe.Consumer[order] {
	t.Helper()
	if cfg.Scope == "" {
		cfg.Scope = "orders"
	}
	if cfg.Key == nil {
		cfg.Key = orderKey
	}
	if h == nil {
		h = insertEffect
	}
	c, err := dedupe.NewConsumer(b.inbox, cfg, h)
	if err != nil {
		t.Fatalf("new consumer: %v", err)
	}
	return c
}

func TestHandleConcurrentDuplicatesOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int64
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		runs.Add(1)
		time.Sleep(20 * time.Millisecond) // keep the claim open while the others arrive
		return insertEffect(ctx, tx, o)
	})
	const n = 50
	outcomes := make([]dedupe.Outcome, n)
	errs := make([]error, n)
	together(n, func(i int) { outcomes[i], errs[i] = c.Handle(context.Background(), order{ID: "o-1"}) })

	counts := map[dedupe.Outcome]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("delivery %d: %v", i, errs[i])
		}
		counts[outcomes[i]]++
	}
	if counts[dedupe.OutcomeClaimed] != 1 || counts[dedupe.OutcomeDuplicate] != n-1 {
		t.Fatalf("outcomes = %v, want 1 claimed and %d duplicates", counts, n-1)
	}
	if got := b.effects(t, "o-1"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

func TestHandleManyKeysWithDuplicatesExactCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, nil)
	const keys, copies = 200, 5
	var failures atomic.Int64
	together(16, func(w int) {
		for n := w; n < keys*copies; n += 16 {
			if _, err := c.Handle(context.Background(), order{ID: fmt.Sprintf("k-%d", n%keys)}); err != nil {
				failures.Add(1)
				t.Errorf("handle: %v", err)
			}
		}
	})
	if got := b.db.Count(t, "SELECT count(*) FROM effects"); got != keys {
		t.Fatalf("effects = %d, want %d", got, keys)
	}
	if got := b.db.Count(t, "SELECT count(DISTINCT msg_key) FROM effects"); got != keys {
		t.Fatalf("distinct keys = %d, want %d", got, keys)
	}
}

func TestHandleFailureRollsBackThenRetrySucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := errors.New("downstream unavailable")
	var calls atomic.Int64
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		if err := insertEffect(ctx, tx, o); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return boom // the effect above must roll back with the claim
		}
		return nil
	})
	ctx := context.Background()
	out, err := c.Handle(ctx, order{ID: "o-2"})
	var he *dedupe.HandlerError
	if out != dedupe.OutcomeRetry || !errors.As(err, &he) || !errors.Is(err, boom) {
		t.Fatalf("first attempt = %v, %v; want retry with the handler error", out, err)
	}
	if he.Attempt != 1 || he.Poisoned {
		t.Fatalf("handler error = %+v, want attempt 1, not poisoned", he)
	}
	if got := b.effects(t, "o-2"); got != 0 {
		t.Fatalf("effects after failure = %d, want 0", got)
	}
	if out, err := c.Handle(ctx, order{ID: "o-2"}); out != dedupe.OutcomeClaimed || err != nil {
		t.Fatalf("retry = %v, %v; want claimed", out, err)
	}
	if out, err := c.Handle(ctx, order{ID: "o-2"}); out != dedupe.OutcomeDuplicate || err != nil {
		t.Fatalf("redelivery = %v, %v; want duplicate", out, err)
	}
	if got := b.effects(t, "o-2"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	rec, err := b.inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: "o-2"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != dedupe.StateComplete || rec.Attempts != 2 {
		t.Fatalf("record = %s after %d attempts, want complete after 2", rec.State, rec.Attempts)
	}
}

func TestHandlePanicBecomesErrorAndRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		if err := insertEffect(ctx, tx, o); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			panic("nil map somewhere")
		}
		return nil
	})
	ctx := context.Background()
	out, err := c.Handle(ctx, order{ID: "o-3"})
	var pe *dedupe.PanicError
	if out != dedupe.OutcomeRetry || !errors.As(err, &pe) || pe.Value != "nil map somewhere" || len(pe.Stack) == 0 {
		t.Fatalf("panic attempt = %v, %v; want retry with a *PanicError", out, err)
	}
	if got := b.effects(t, "o-3"); got != 0 {
		t.Fatalf("effects after panic = %d, want 0", got)
	}
	if out, err := c.Handle(ctx, order{ID: "o-3"}); out != dedupe.OutcomeClaimed || err != nil {
		t.Fatalf("retry = %v, %v; want claimed", out, err)
	}
	if got := b.effects(t, "o-3"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

func TestHandleFingerprintConflictRunsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{
		Fingerprint: func(o order) []byte { return []byte(strconv.Itoa(o.Total)) },
	}, nil)
	ctx := context.Background()
	if out, err := c.Handle(ctx, order{ID: "o-4", Total: 100}); out != dedupe.OutcomeClaimed || err != nil {
		t.Fatalf("first = %v, %v", out, err)
	}
	out, err := c.Handle(ctx, order{ID: "o-4", Total: 999})
	if out != dedupe.OutcomeConflict || !errors.Is(err, dedupe.ErrConflict) {
		t.Fatalf("different payload = %v, %v; want conflict", out, err)
	}
	if out, err := c.Handle(ctx, order{ID: "o-4", Total: 100}); out != dedupe.OutcomeDuplicate || err != nil {
		t.Fatalf("same payload = %v, %v; want duplicate", out, err)
	}
	if got := b.effects(t, "o-4"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

func TestHandleMaxAttemptsPoisonsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{MaxAttempts: 3}, func(ctx context.Context, tx pgx.Tx, o order) error {
		calls.Add(1)
		return errors.New("cannot parse")
	})
	ctx := context.Background()
	for attempt := 1; attempt <= 3; attempt++ {
		out, err := c.Handle(ctx, order{ID: "o-5"})
		want := dedupe.OutcomeRetry
		if attempt == 3 {
			want = dedupe.OutcomePoisoned
		}
		var he *dedupe.HandlerError
		if out != want || !errors.As(err, &he) || he.Attempt != attempt {
			t.Fatalf("attempt %d = %v, %v; want %v", attempt, out, err, want)
		}
		if attempt == 3 && !errors.Is(err, dedupe.ErrPoisoned) {
			t.Fatalf("last attempt error %v does not match ErrPoisoned", err)
		}
	}
	out, err := c.Handle(ctx, order{ID: "o-5"})
	if out != dedupe.OutcomePoisoned || !errors.Is(err, dedupe.ErrPoisoned) {
		t.Fatalf("after poison = %v, %v", out, err)
	}
	if calls.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", calls.Load())
	}
	rec, err := b.inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: "o-5"})
	if err != nil || rec.State != dedupe.StateFailed || rec.LastError != "cannot parse" {
		t.Fatalf("record = %+v, %v; want failed with the last error", rec, err)
	}
	// An operator releases the key: it is processed afresh.
	if err := b.inbox.Release(ctx, rec.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Lookup(ctx, rec.Key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("after release: %v, want ErrNotFound", err)
	}
}

func TestHandlePermanentErrorPoisonsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		return dedupe.Permanent(errors.New("unknown schema version"))
	})
	out, err := c.Handle(context.Background(), order{ID: "o-6"})
	if out != dedupe.OutcomePoisoned || !errors.Is(err, dedupe.ErrPoisoned) || !dedupe.IsPermanent(err) {
		t.Fatalf("permanent = %v, %v; want poisoned", out, err)
	}
}

func TestHandleLockTimeoutReportsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{LockTimeout: 100 * time.Millisecond}, nil)

	// Another transaction holds the claim, uncommitted.
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if cl, err := b.inbox.Claim(ctx, tx, dedupe.Key{Scope: "orders", ID: "o-7"}); err != nil || cl.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("claim = %v, %v", cl, err)
	}
	start := time.Now()
	out, err := c.Handle(ctx, order{ID: "o-7"})
	if out != dedupe.OutcomeInFlight || !errors.Is(err, dedupe.ErrInFlight) {
		t.Fatalf("concurrent duplicate = %v, %v; want in flight", out, err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("waited %v, want about the lock timeout", waited)
	}
	// The holder rolls back: the redelivery processes the message.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Handle(ctx, order{ID: "o-7"}); out != dedupe.OutcomeClaimed || err != nil {
		t.Fatalf("after rollback = %v, %v", out, err)
	}
	if got := b.effects(t, "o-7"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

func TestHandleSerializableConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{IsoLevel: pgx.Serializable, TxRetries: 10}, nil)
	const n = 20
	errs := make([]error, n)
	together(n, func(i int) { _, errs[i] = c.Handle(context.Background(), order{ID: "o-8"}) })
	for i, err := range errs {
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if got := b.effects(t, "o-8"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

func TestHandleStoresResultForDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, func(ctx context.Context, tx pgx.Tx, o order) error {
		cl := dedupe.ClaimFromContext(ctx)
		if cl == nil {
			return errors.New("no claim in context")
		}
		cl.SetResult(dedupe.Result{Status: 201, Body: []byte("charge " + cl.DerivedKey("charge"))})
		return insertEffect(ctx, tx, o)
	})
	ctx := context.Background()
	if _, err := c.Handle(ctx, order{ID: "o-9"}); err != nil {
		t.Fatal(err)
	}
	// A duplicate claimed by hand gets the stored result back.
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	cl, err := b.inbox.Claim(ctx, tx, dedupe.Key{Scope: "orders", ID: "o-9"})
	if err != nil {
		t.Fatal(err)
	}
	want := "charge " + dedupe.DeriveKey(dedupe.Key{Scope: "orders", ID: "o-9"}, "charge")
	if cl.Outcome != dedupe.OutcomeDuplicate || cl.Result.Status != 201 || string(cl.Result.Body) != want {
		t.Fatalf("duplicate claim = %+v %+v, want the stored result", cl, cl.Result)
	}
}

func TestHandleConnectionKilledMidTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// The consumer gets its own pool so its backend can be found and killed.
	pool := b.db.AppPool(t, "victim-"+b.db.Schema, 0)
	inbox, err := dedupe.New(pool, dedupe.Config{Clock: b.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
		func(ctx context.Context, tx pgx.Tx, o order) error {
			if err := insertEffect(ctx, tx, o); err != nil {
				return err
			}
			if calls.Add(1) == 1 {
				for _, pid := range b.db.BackendPIDs(t, "victim-"+b.db.Schema) {
					b.db.Terminate(t, pid)
				}
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Handle(ctx, order{ID: "o-10"}); err == nil {
		t.Fatal("handle on a killed connection succeeded")
	}
	if got := b.effects(t, "o-10"); got != 0 {
		t.Fatalf("effects after kill = %d, want 0", got)
	}
	if out, err := c.Handle(ctx, order{ID: "o-10"}); out != dedupe.OutcomeClaimed || err != nil {
		t.Fatalf("redelivery = %v, %v", out, err)
	}
	if got := b.effects(t, "o-10"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// TestHandleAcrossProcesses runs the same deliveries from several OS
// processes at once; each process is this test binary in helper mode.
func TestHandleAcrossProcesses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const procs, keys = 4, 100
	cmds := make([]*exec.Cmd, procs)
	for p := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "DEDUPE_HELPER_URL="+b.db.URL, "DEDUPE_HELPER_KEYS="+strconv.Itoa(keys))
		cmds[p] = cmd
	}
	claimed := make([]int, procs)
	together(procs, func(p int) {
		out, err := cmds[p].Output()
		if err != nil {
			t.Errorf("process %d: %v\n%s", p, err, out)
			return
		}
		if _, err := fmt.Sscanf(string(out), "claimed=%d", &claimed[p]); err != nil {
			t.Errorf("process %d printed %q: %v", p, out, err)
		}
	})
	total := 0
	for _, n := range claimed {
		total += n
	}
	if total != keys {
		t.Fatalf("processes claimed %v = %d keys in all, want %d", claimed, total, keys)
	}
	if got := b.db.Count(t, "SELECT count(*) FROM effects"); got != keys {
		t.Fatalf("effects = %d, want %d", got, keys)
	}
	if got := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'complete'"); got != keys {
		t.Fatalf("complete keys = %d, want %d", got, keys)
	}
}

// consumerHelperProcess is the body of TestHandleAcrossProcesses'
// subprocesses, started by TestMain when DEDUPE_HELPER_URL is set: four
// workers handle every key, and it prints how many it claimed.
func consumerHelperProcess(url string, keys int) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		return err
	}
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
	if err != nil {
		return err
	}
	var claimed atomic.Int64
	errs := make([]error, 4)
	together(4, func(w int) {
		for n := range keys {
			out, err := c.Handle(ctx, order{ID: fmt.Sprintf("p-%d", (n+w*7)%keys)})
			if err != nil {
				errs[w] = err
				return
			}
			if out == dedupe.OutcomeClaimed {
				claimed.Add(1)
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("claimed=%d\n", claimed.Load())
	return nil
}

func TestNewConsumerValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cases := map[string]dedupe.ConsumerConfig[order]{
		"no scope":         {Key: orderKey},
		"no key func":      {Scope: "s"},
		"negative timeout": {Scope: "s", Key: orderKey, LockTimeout: -time.Second},
		"control in scope": {Scope: "s\x00", Key: orderKey},
	}
	for name, cfg := range cases {
		if _, err := dedupe.NewConsumer(b.inbox, cfg, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{}, nil)
	for _, id := range []string{"", string(make([]byte, 256)), "a\x00b"} {
		out, err := c.Handle(context.Background(), order{ID: id})
		if out != 0 || !errors.Is(err, dedupe.ErrInvalidKey) {
			t.Errorf("key %q: %v, %v; want ErrInvalidKey", id, out, err)
		}
	}
	if got := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); got != 0 {
		t.Fatalf("rows after refusals = %d, want 0", got)
	}
}
