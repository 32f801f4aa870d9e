package httpidem_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// TestIdemTransactionalDuplicateGets409WithoutWaitingForTheHandler: in
// transactional mode a duplicate waits on the claim's unique index only up
// to the lock timeout and answers 409; it never waits for the holder's
// handler to finish. The holder stays blocked until every duplicate has
// answered, so a duplicate that waited for it would hang the test.
func TestIdemTransactionalDuplicateGets409WithoutWaitingForTheHandler(t *testing.T) {
	t.Parallel()
	forDrivers(t, func(t *testing.T, drv driver) {
		b := setupOn(t, drv)
		blocked := cart
		blocked.Block = true
		var (
			first    reply
			finished atomic.Bool
			wg       sync.WaitGroup
		)
		wg.Go(func() { first = b.post(t, "acme", "key-hold", blocked); finished.Store(true) })
		select {
		case <-b.blocked:
		case <-time.After(30 * time.Second):
			t.Fatal("the first request never reached the handler")
		}
		const n = 4
		replies := make([]reply, n)
		done := make(chan struct{})
		go func() {
			defer close(done)
			together(n, func(i int) { replies[i] = b.post(t, "acme", "key-hold", blocked) })
		}()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			close(b.unblock)
			wg.Wait()
			t.Fatal("the duplicates waited for the holder's handler")
		}
		for _, r := range replies {
			if r.status != http.StatusConflict || r.header.Get("Retry-After") == "" {
				t.Fatalf("duplicate while the holder runs = %d %s, want 409 with Retry-After", r.status, r.body)
			}
		}
		if finished.Load() {
			t.Fatal("the holder finished before the duplicates answered")
		}
		close(b.unblock)
		wg.Wait()
		if first.status != http.StatusCreated || first.replayed {
			t.Fatalf("holder = %d %s, want 201", first.status, first.body)
		}
		if r := b.post(t, "acme", "key-hold", blocked); r.status != http.StatusCreated || !r.replayed || r.id != first.id {
			t.Fatalf("after the holder = %d replayed=%v, want the replay", r.status, r.replayed)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want 1", got)
		}
	})
}

// TestIdemTransactionalLockTimeoutBoundsOnlyTheClaim: the lock timeout that
// makes a duplicate answer 409 is set for the claim alone; the handler's
// statements run with the connection's own lock_timeout, so a handler that
// waits for a row lock is not turned into a stored 500.
func TestIdemTransactionalLockTimeoutBoundsOnlyTheClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{LockTimeout: 250 * time.Millisecond})
	var want string
	if err := b.db.Pool.QueryRow(context.Background(), "SHOW lock_timeout").Scan(&want); err != nil {
		t.Fatal(err)
	}
	var got string
	h := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := httpidem.Tx(r.Context())
		if err == nil {
			err = tx.QueryRow(r.Context(), "SHOW lock_timeout").Scan(&got)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	b.handler = h
	if r := b.post(t, "acme", "key-show", cart); r.status != http.StatusNoContent {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if got != want || got == "250ms" {
		t.Fatalf("the handler's lock_timeout = %q, want the connection's %q", got, want)
	}
}

// TestIdemTransactionalTakeoverKeepsTheClaimOnServerError: a transactional
// claim that takes over an expired lease (here left by a leased-mode
// request whose process died) runs a statement after the pipelined
// savepoint. The savepoint is taken again after it, so a handler 5xx rolls
// back to just after the takeover: the claim stays held and the error
// response is stored, and the handler runs once however many duplicates
// follow.
func TestIdemTransactionalTakeoverKeepsTheClaimOnServerError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	held, err := b.mw.Inbox().Begin(ctx, dedupe.Key{Scope: "acme", ID: "key-takeover"})
	if err != nil || held.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("leased claim = %+v, %v", held, err)
	}
	b.clock.Advance(httpidem.DefaultLease + time.Second) // its holder died
	fail := order{CartID: "c", TotalCents: 1, Fail: true}
	first := b.post(t, "acme", "key-takeover", fail)
	if first.status != http.StatusInternalServerError || first.replayed {
		t.Fatalf("first = %d replayed=%v, want a fresh 500", first.status, first.replayed)
	}
	const n = 4
	replies := make([]reply, n)
	together(n, func(i int) { replies[i] = b.post(t, "acme", "key-takeover", fail) })
	if fresh, _, _ := countReplies(t, replies, http.StatusInternalServerError); fresh != 0 {
		t.Fatalf("%d duplicates ran the handler again, want the stored 500 replayed", fresh)
	}
	if got := b.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	rec, err := b.mw.Inbox().Lookup(ctx, dedupe.Key{Scope: "acme", ID: "key-takeover"})
	if err != nil || rec.State != dedupe.StateComplete || rec.Result == nil || rec.Result.Status != 500 || rec.Attempts != 2 {
		t.Fatalf("stored key = %+v, %v; want complete with the 500, on attempt 2", rec, err)
	}
	if got := b.orders(t, "acme"); got != 0 {
		t.Fatalf("orders = %d, want 0", got)
	}
}

// TestIdemTransactionalTakeoverWaitsAtMostTheLockTimeout: after a run of new
// keys, a claim that finds its key taken reads it after the claim's round
// trip, a plain read sent without the lock timeout. The takeover of an
// expired lease that follows may wait on the row, so it runs under the lock
// timeout again: while another transaction holds the row, the request
// answers 409 within LockTimeout instead of waiting for that transaction,
// and once it ended the key is taken over and handled once.
func TestIdemTransactionalTakeoverWaitsAtMostTheLockTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{LockTimeout: 100 * time.Millisecond})
	ctx := context.Background()
	if r := b.post(t, "acme", "key-new", cart); r.status != http.StatusCreated || r.replayed {
		t.Fatalf("new key = %d %s", r.status, r.body)
	}
	key := dedupe.Key{Scope: "acme", ID: "key-row-held"}
	if held, err := b.mw.Inbox().Begin(ctx, key); err != nil || held.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("leased claim = %+v, %v", held, err)
	}
	b.clock.Advance(httpidem.DefaultLease + time.Second) // its holder died
	locker, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx) //nolint:errcheck // ended below
	if _, err := locker.Exec(ctx, `SELECT 1 FROM `+httpidem.DefaultTable+` WHERE scope = $1 AND key = $2 FOR UPDATE`,
		key.Scope, key.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan reply, 1)
	go func() { done <- b.post(t, "acme", key.ID, cart) }()
	select {
	case r := <-done:
		if r.status != http.StatusConflict || r.header.Get("Retry-After") == "" {
			t.Fatalf("takeover while another transaction holds the row = %d %s, want 409 with Retry-After", r.status, r.body)
		}
	case <-time.After(60 * time.Second):
		_ = locker.Rollback(ctx)
		<-done
		t.Fatal("the takeover waited for the transaction holding the row, not the lock timeout")
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := b.post(t, "acme", key.ID, cart); r.status != http.StatusCreated || r.replayed {
		t.Fatalf("takeover after the row was released = %d replayed=%v %s, want a fresh 201", r.status, r.replayed, r.body)
	}
	if got := b.calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2 (the new key, the takeover)", got)
	}
}
