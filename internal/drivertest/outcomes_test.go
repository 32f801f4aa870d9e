package drivertest_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// TestHandleOutcomeTable drives every row of Consumer.Handle's documented
// outcome table on every driver, and checks for each the outcome, the
// error it matches with errors.Is, and whether the attempt was counted (the
// inbox row's attempts; HandlerError.Attempt). No error text repeats the
// package's "dedupe: " prefix.
func TestHandleOutcomeTable(t *testing.T) {
	if got := dedupe.OutcomeNone.String(); got != "none" {
		t.Fatalf("OutcomeNone.String() = %q, want none", got)
	}
	t.Run("pgx", func(t *testing.T) { t.Parallel(); outcomeTable(t, pgxKit) })
	t.Run("database-sql-pgx-stdlib", func(t *testing.T) { t.Parallel(); outcomeTable(t, sqlKit("pgx")) })
	t.Run("database-sql-lib-pq", func(t *testing.T) { t.Parallel(); outcomeTable(t, sqlKit("postgres")) })
}

// outcomeRow is one row of the table: the consumer and inbox it needs, what
// happens before the handling (prep), the handler's behaviour, and what
// Handle must return. attempts is the key's attempts in the inbox after
// the handling (-1: no row).
type outcomeRow[TTx any] struct {
	name     string
	cfg      dedupe.Config
	key      func(string) (string, error) // nil: the message is its key
	fp       []byte
	prep     func(t *testing.T, b *bundle[TTx], inbox *dedupe.Inbox, c *dedupe.Consumer[string], ctx context.Context)
	handler  func(ctx context.Context, k kit[TTx], tx TTx, c *dedupe.Consumer[string], cancel context.CancelFunc) error
	proxy    func(b *bundle[TTx], inbox **dedupe.Inbox) pgproxy.Policy
	want     dedupe.Outcome
	is       error // nil: no error
	poisoned bool  // the error matches ErrPoisoned too
	attempts int
	effects  int
}

func insertEffect[TTx any](ctx context.Context, k kit[TTx], tx TTx) error {
	return k.exec(ctx, tx, `INSERT INTO effects (key) VALUES ('o-1')`)
}

func outcomeRows[TTx any]() []outcomeRow[TTx] {
	boom := errors.New("downstream unavailable")
	ok := func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], _ context.CancelFunc) error {
		return insertEffect(ctx, k, tx)
	}
	handleOnce := func(t *testing.T, _ *bundle[TTx], _ *dedupe.Inbox, c *dedupe.Consumer[string], ctx context.Context) {
		if out, err := c.Handle(ctx, "o-1"); err != nil || out != dedupe.OutcomeClaimed {
			t.Fatalf("first handling = %v, %v", out, err)
		}
	}
	return []outcomeRow[TTx]{
		{name: "Claimed", handler: ok, want: dedupe.OutcomeClaimed, attempts: 1, effects: 1},
		{name: "Duplicate", prep: handleOnce, handler: ok, want: dedupe.OutcomeDuplicate, attempts: 1, effects: 1},
		{name: "RetryHandlerFailed", handler: func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], _ context.CancelFunc) error {
			_ = insertEffect(ctx, k, tx)
			return boom
		}, want: dedupe.OutcomeRetry, is: boom, attempts: 1},
		{name: "RetryPanicked", handler: func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], _ context.CancelFunc) error {
			_ = insertEffect(ctx, k, tx)
			panic(boom)
		}, want: dedupe.OutcomeRetry, is: boom, attempts: 1},
		{name: "PoisonedTxEndedAndBegunAgain", handler: func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], _ context.CancelFunc) error {
			if err := k.exec(ctx, tx, "ROLLBACK; BEGIN"); err != nil {
				return err
			}
			return insertEffect(ctx, k, tx)
		}, want: dedupe.OutcomePoisoned, is: dedupe.ErrTxEnded, poisoned: true, attempts: 1},
		{name: "PoisonedTxEndedWithAWriteAfterIt", handler: func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], _ context.CancelFunc) error {
			// One simple-protocol statement: no guard sees between the two.
			return k.exec(ctx, tx, `ROLLBACK; INSERT INTO effects (key) VALUES ('o-1')`)
		}, want: dedupe.OutcomePoisoned, is: dedupe.ErrTxEnded, poisoned: true, attempts: 1, effects: 1},
		{name: "RetryStatementFailedHandlerReturnsNil", handler: func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], _ context.CancelFunc) error {
			_ = insertEffect(ctx, k, tx)
			_ = k.exec(ctx, tx, `INSERT INTO no_such_table VALUES (1)`)
			return nil
		}, want: dedupe.OutcomeRetry, is: dedupe.ErrTxEnded, attempts: 1},
		{name: "RetryCancelledHandlerFails", handler: func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], cancel context.CancelFunc) error {
			_ = insertEffect(ctx, k, tx)
			cancel()
			return insertEffect(ctx, k, tx)
		}, want: dedupe.OutcomeRetry, is: context.Canceled, attempts: -1},
		{name: "RetryCancelledHandlerReturnsNil", handler: func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], cancel context.CancelFunc) error {
			_ = insertEffect(ctx, k, tx)
			cancel()
			return nil
		}, want: dedupe.OutcomeRetry, is: context.Canceled, attempts: -1},
		{name: "PoisonedPermanent", handler: func(ctx context.Context, k kit[TTx], tx TTx, _ *dedupe.Consumer[string], _ context.CancelFunc) error {
			_ = insertEffect(ctx, k, tx)
			return dedupe.Permanent(boom)
		}, want: dedupe.OutcomePoisoned, is: dedupe.ErrPoisoned, attempts: 1},
		{name: "PoisonedAttemptsUsedUp", cfg: dedupe.Config{MaxAttempts: 2},
			prep: func(t *testing.T, _ *bundle[TTx], _ *dedupe.Inbox, c *dedupe.Consumer[string], ctx context.Context) {
				if out, err := c.Handle(ctx, "o-1"); out != dedupe.OutcomeRetry || !errors.Is(err, boom) {
					t.Fatalf("first attempt = %v, %v", out, err)
				}
			},
			handler: func(context.Context, kit[TTx], TTx, *dedupe.Consumer[string], context.CancelFunc) error { return boom },
			want:    dedupe.OutcomePoisoned, is: dedupe.ErrPoisoned, attempts: 2},
		{name: "InFlight",
			prep: func(t *testing.T, _ *bundle[TTx], inbox *dedupe.Inbox, _ *dedupe.Consumer[string], ctx context.Context) {
				if c, err := inbox.Begin(ctx, dedupe.Key{Scope: "orders", ID: "o-1"}); err != nil || c.Outcome != dedupe.OutcomeClaimed {
					t.Fatalf("leased claim = %v, %v", c, err)
				}
			},
			handler: ok, want: dedupe.OutcomeInFlight, is: dedupe.ErrInFlight, attempts: 1},
		{name: "Conflict", fp: []byte("other"), prep: func(t *testing.T, _ *bundle[TTx], inbox *dedupe.Inbox, _ *dedupe.Consumer[string], ctx context.Context) {
			c, err := inbox.Begin(ctx, dedupe.Key{Scope: "orders", ID: "o-1", Fingerprint: []byte("first")})
			if err != nil {
				t.Fatal(err)
			}
			if err := inbox.Complete(ctx, c, dedupe.Result{}); err != nil {
				t.Fatal(err)
			}
		}, handler: ok, want: dedupe.OutcomeConflict, is: dedupe.ErrConflict, attempts: 1},
		{name: "UnknownLostCommitKeyPurged", cfg: dedupe.Config{Lease: time.Millisecond, Retention: time.Millisecond},
			proxy: func(b *bundle[TTx], inbox **dedupe.Inbox) pgproxy.Policy {
				var committed, purged atomic.Bool
				return func(ev pgproxy.Event) pgproxy.Action {
					if pgproxy.IsCommit(ev) && committed.CompareAndSwap(false, true) {
						return pgproxy.DropReply
					}
					// The resolution's probe: the committed key was purged
					// before it reads.
					if ev.Runs && strings.Contains(ev.Query, "DO UPDATE SET token = t.token") && purged.CompareAndSwap(false, true) {
						b.clock.Advance(time.Hour)
						if n, err := (*inbox).Purge(context.Background(), 0); err != nil || n != 1 {
							panic("purge before the resolution: " + errors.Join(err).Error())
						}
					}
					return pgproxy.Forward
				}
			},
			handler: ok, want: dedupe.OutcomeUnknown, is: dedupe.ErrOutcomeUnknown, attempts: -1, effects: 1},
		{name: "NoneReentrant", handler: func(ctx context.Context, k kit[TTx], tx TTx, c *dedupe.Consumer[string], _ context.CancelFunc) error {
			out, err := c.Handle(ctx, "o-1")
			if out != dedupe.OutcomeNone || !errors.Is(err, dedupe.ErrReentrant) {
				return errors.New("reentrant call: unexpected " + out.String())
			}
			return err
		}, want: dedupe.OutcomeRetry, is: dedupe.ErrReentrant, attempts: 1},
		{name: "NoneInvalidKey", key: func(string) (string, error) { return "", nil }, handler: ok,
			want: dedupe.OutcomeNone, is: dedupe.ErrInvalidKey, attempts: -1},
		{name: "NoneNoKey", key: func(string) (string, error) { return "", boom }, handler: ok,
			want: dedupe.OutcomeNone, is: dedupe.ErrNoKey, attempts: -1},
		{name: "NoneDatabaseFailed", cfg: dedupe.Config{Table: "no_such_inbox"}, handler: ok,
			want: dedupe.OutcomeNone, is: dedupe.ErrNotMigrated, attempts: -1},
	}
}

func outcomeTable[TTx any](t *testing.T, k kit[TTx]) {
	for _, row := range outcomeRows[TTx]() {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, k)
			db := b.inbox
			var inbox *dedupe.Inbox
			if row.proxy != nil {
				u := startProxy(t, b.db.URL, row.proxy(b, &inbox))
				db = k.open(t, u)
			}
			inbox = b.newInbox(t, db, row.cfg)
			keyFn := row.key
			if keyFn == nil {
				keyFn = func(m string) (string, error) { return m, nil }
			}
			var cancel context.CancelFunc
			var c *dedupe.Consumer[string]
			c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{Scope: "orders", Key: keyFn,
				Fingerprint: func(string) []byte { return row.fp }},
				func(ctx context.Context, tx TTx, _ string) error { return row.handler(ctx, k, tx, c, cancel) })
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if row.prep != nil {
				row.prep(t, b, inbox, c, ctx)
			}
			hctx, hcancel := context.WithCancel(ctx)
			defer hcancel()
			cancel = hcancel
			out, err := c.Handle(hctx, "o-1")
			if out != row.want {
				t.Fatalf("outcome %v (%v), want %v", out, err, row.want)
			}
			if row.is == nil && err != nil || row.is != nil && !errors.Is(err, row.is) {
				t.Fatalf("error %v, want one matching %v", err, row.is)
			}
			if row.poisoned && !errors.Is(err, dedupe.ErrPoisoned) {
				t.Fatalf("error %v, want one matching ErrPoisoned too", err)
			}
			if err != nil {
				for _, line := range strings.Split(err.Error(), "\n") {
					if strings.Count(line, "dedupe:") > 1 {
						t.Fatalf("error text repeats the package's prefix: %q", line)
					}
				}
			}
			if he, ok := errors.AsType[*dedupe.HandlerError](err); ok && row.attempts > 0 && he.Attempt != row.attempts {
				t.Fatalf("HandlerError.Attempt = %d, want %d", he.Attempt, row.attempts)
			}
			if row.cfg.Table != "" {
				return
			}
			rec, lerr := inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: "o-1"})
			switch {
			case row.attempts < 0 && !errors.Is(lerr, dedupe.ErrNotFound):
				t.Fatalf("lookup = %+v, %v; want no row (not an attempt)", rec, lerr)
			case row.attempts >= 0 && (lerr != nil || rec.Attempts != row.attempts):
				t.Fatalf("lookup = %+v, %v; want %d attempts", rec, lerr, row.attempts)
			}
			if got := b.effects(t, "o-1"); got != row.effects {
				t.Fatalf("effects = %d, want %d", got, row.effects)
			}
		})
	}
}
