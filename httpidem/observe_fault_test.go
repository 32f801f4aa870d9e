package httpidem_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// failingBeginDB passes everything through to the pool until fail is set;
// then BeginTx (what Inbox.Resolve's probe uses) fails with a server error
// that is not a connection error, so Resolve gives up at once.
type failingBeginDB struct {
	*pgxpool.Pool
	fail atomic.Bool
}

func (d *failingBeginDB) Begin(ctx context.Context) (pgx.Tx, error) {
	return d.BeginTx(ctx, pgx.TxOptions{})
}

func (d *failingBeginDB) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	if d.fail.Load() {
		return nil, &pgconn.PgError{Code: "42501", Message: "review: injected probe failure"}
	}
	return d.Pool.BeginTx(ctx, o)
}

// recordingObserver records every handling's outcome and error.
type recordingObserver struct {
	dedupe.NopObserver
	mu      sync.Mutex
	started int
	done    []dedupe.HandleDone
}

func (o *recordingObserver) StartHandle(ctx context.Context, _ dedupe.HandleInfo) (context.Context, func(dedupe.HandleDone)) {
	o.mu.Lock()
	o.started++
	o.mu.Unlock()
	return ctx, func(d dedupe.HandleDone) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.done = append(o.done, d)
	}
}

func (o *recordingObserver) snapshot() (int, []dedupe.HandleDone) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.started, append([]dedupe.HandleDone(nil), o.done...)
}

// TestObserverEndedTxWithUnresolvableOutcomeIsUnknown: in
// transactional mode a handler ends the request transaction behind the
// middleware's back and the fresh connection that should tell whether it
// committed cannot answer. The client is told 503 ErrOutcomeUnknown; the
// Observer must be told OutcomeUnknown too (as for a lost COMMIT reply),
// not OutcomeRetry ("the key was released"), which nobody knows.
func TestObserverEndedTxWithUnresolvableOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t, dbtest.Options{MaxConns: 4})
	fdb := &failingBeginDB{Pool: db.Pool}
	obs := &recordingObserver{}
	mw, err := httpidem.New(fdb, httpidem.Config{
		Logger: testLogger(t),
		Tenant: func(r *http.Request) (string, error) { return "acme", nil },
		Inbox:  dedupe.Config{Observer: obs},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := httpidem.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = tx.Exec(r.Context(), "ROLLBACK") // ends the request transaction behind the middleware's back
		fdb.fail.Store(true)                    // ... and the database stops answering fresh transactions
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader([]byte(`{}`)))
	req.Header.Set("Idempotency-Key", "ended-unknown")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("answer = %d %s, want 503 (outcome unknown)", rec.Code, rec.Body)
	}
	_, done := obs.snapshot()
	if len(done) != 1 {
		t.Fatalf("handlings reported = %d, want 1", len(done))
	}
	if d := done[0]; d.Outcome != dedupe.OutcomeUnknown {
		t.Errorf("reported %v (err %v) while the client was told the outcome is unknown; want %v",
			d.Outcome, d.Err, dedupe.OutcomeUnknown)
	}
}

// TestObserverInvalidTenantIsNotAHandling: a request whose tenant is
// not a valid scope is refused (401) before any claim. The core does not
// report it (Begin validates the key before it observes), so leased mode
// reports nothing; transactional mode must report the same.
func TestObserverInvalidTenantIsNotAHandling(t *testing.T) {
	t.Parallel()
	started := map[httpidem.Mode]int{}
	var mu sync.Mutex
	forModesSeq := []httpidem.Mode{httpidem.Transactional, httpidem.Leased}
	for _, mode := range forModesSeq {
		obs := &recordingObserver{}
		b := setup(t, httpidem.Config{Mode: mode, Inbox: dedupe.Config{Observer: obs},
			Tenant: func(*http.Request) (string, error) { return strings.Repeat("t", 300), nil }})
		if r := b.post(t, "ignored", "bad-tenant", cart); r.status != http.StatusUnauthorized {
			t.Fatalf("%v: answer %d %s, want 401", mode, r.status, r.body)
		}
		n, _ := obs.snapshot()
		mu.Lock()
		started[mode] = n
		mu.Unlock()
	}
	if started[httpidem.Transactional] != started[httpidem.Leased] {
		t.Errorf("handlings reported for a refused invalid tenant: transactional %d, leased %d; want the same (0)",
			started[httpidem.Transactional], started[httpidem.Leased])
	}
}

// TestObserverLeaseLostHandlingIsReported: leased mode; the first holder
// hangs past its lease, a retry takes the key over and completes, and the
// stale holder's completion is refused (409, ErrLeaseLost). Every handling
// the Observer was told of must end: started == done.
func TestObserverLeaseLostHandlingIsReported(t *testing.T) {
	t.Parallel()
	obs := &recordingObserver{}
	b := setup(t, httpidem.Config{Mode: httpidem.Leased, Inbox: dedupe.Config{Observer: obs}})
	blocked := cart
	blocked.Block = true
	var stale, retry reply
	var wg sync.WaitGroup
	wg.Go(func() { stale = b.post(t, "acme", "key-lost", blocked) })
	<-b.blocked
	b.clock.Advance(httpidem.DefaultLease + time.Second)
	wg.Go(func() { retry = b.post(t, "acme", "key-lost", blocked) })
	<-b.blocked
	close(b.unblock)
	wg.Wait()
	if stale.status != http.StatusConflict || retry.status != http.StatusCreated {
		t.Fatalf("stale %d, retry %d; want 409 and 201", stale.status, retry.status)
	}
	started, done := obs.snapshot()
	if started != len(done) {
		t.Errorf("handlings started = %d, ended = %d (%+v): the stale holder's handling is never reported", started, len(done), done)
	}
}

// TestObserverFailedCommitIsNotClaimed: the request transaction's
// COMMIT fails (a deferred foreign key): nothing committed, the client is
// told 503 and the key is free for the retry. The Observer must not be told
// the handling was claimed: transactional mode reports OutcomeRetry. (Leased
// mode completes the key with Inbox.CompleteTx, which reports the handling
// when the completion is written, before the middleware's COMMIT: a known
// limit of that API, documented there.)
func TestObserverFailedCommitIsNotClaimed(t *testing.T) {
	t.Parallel()
	for _, mode := range []httpidem.Mode{httpidem.Transactional} {
		obs := &recordingObserver{}
		db := dbtest.New(t, dbtest.Options{MaxConns: 4})
		mw, err := httpidem.New(db.Pool, httpidem.Config{Mode: mode, Logger: testLogger(t),
			Tenant: func(*http.Request) (string, error) { return "acme", nil },
			Inbox:  dedupe.Config{Observer: obs}})
		if err != nil {
			t.Fatal(err)
		}
		if err := mw.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		db.Exec(t, `CREATE TABLE parent (id int PRIMARY KEY)`)
		db.Exec(t, `CREATE TABLE child (pid int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)`)
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := httpidem.Tx(r.Context())
			if err == nil {
				_, err = tx.Exec(r.Context(), `INSERT INTO child VALUES (42)`) // fails only at COMMIT
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		req := httptest.NewRequest(http.MethodPost, "/x", bytes.NewReader([]byte(`{}`)))
		req.Header.Set("Idempotency-Key", "commit-fails")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("answer = %d %s, want 503 (nothing committed)", rec.Code, rec.Body)
		}
		_, done := obs.snapshot()
		if len(done) != 1 || done[0].Outcome == dedupe.OutcomeClaimed {
			t.Errorf("reported %+v for a request whose commit failed (503, key released); want one non-claimed handling", done)
		}
	}
}
