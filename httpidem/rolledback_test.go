package httpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// slowHandler inserts an order through the request transaction and
// answers 201 {"resp":"resp-<n>"}, n counting its calls from 1. Its calls
// listed in slow signal started once their insert is done, then run on
// past their context's end, as a step that ignores its context would,
// until proceed is closed.
func (b *bundle) slowHandler(started chan<- struct{}, proceed <-chan struct{}, slow ...int64) http.Handler {
	return b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := b.calls.Add(1)
		resp := fmt.Sprintf("resp-%d", n)
		tx, err := b.requestTx(r.Context())
		if err == nil {
			_, err = tx.Exec(r.Context(), `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ('acme', $1, 1)`, resp)
		}
		if err != nil {
			httpidem.WriteError(w, r, err)
			return
		}
		if slices.Contains(slow, n) {
			select {
			case started <- struct{}{}:
			default:
			}
			<-r.Context().Done() // the lease ended it; the client is still there
			<-proceed
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"resp":%q}`, resp)
	}))
}

// postSlow sends a POST with key through h.
func postSlow(t *testing.T, h http.Handler, key string) reply {
	t.Helper()
	return toReply(t, serve(h, key))
}

// wantRolledBack fails unless r is the retryable refusal of work rolled
// back: 503 with Retry-After, never replayed.
func wantRolledBack(t *testing.T, what string, r reply) {
	t.Helper()
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || r.replayed {
		t.Fatalf("%s = %d Retry-After=%q replayed=%v %s; want 503 with Retry-After (its work was rolled back)",
			what, r.status, r.header.Get("Retry-After"), r.replayed, r.body)
	}
	var p httpidem.Problem
	if err := json.Unmarshal(r.body, &p); err != nil || p.Status != http.StatusServiceUnavailable {
		t.Fatalf("%s: body %s is not the 503 problem (%v)", what, r.body, err)
	}
}

// wait waits for ch, or fails the test.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not happen", what)
	}
}

// TestIdemLeaseEndedAnswersRetryableError: the handler's context is bounded
// by Config.Inbox.Lease. A handler that inserts its row, runs on past that
// end in a step that ignores its context, then answers 201 while its client
// is still connected, has its work rolled back and its key released; its
// client must not be told it succeeded: it gets 503 with Retry-After, and
// its retry executes the operation once. Before, the client received the
// 201 for an order that was gone.
func TestIdemLeaseEndedAnswersRetryableError(t *testing.T) {
	t.Parallel()
	forDriversModes(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
		b := setupOn(t, drv, httpidem.Config{Mode: mode, Inbox: dedupe.Config{Lease: 2 * time.Second}})
		started, proceed := make(chan struct{}, 1), make(chan struct{})
		close(proceed)
		h := b.slowHandler(started, proceed, 1)
		first := postSlow(t, h, "order-1")
		wantRolledBack(t, "the answer after the lease ended", first)
		if got := b.orders(t, "acme"); got != 0 {
			t.Fatalf("orders = %d, want 0 (rolled back)", got)
		}
		key := dedupe.Key{Scope: "acme", ID: "order-1"}
		if rec, err := b.mw.Inbox().Lookup(context.Background(), key); err == nil && rec.State == dedupe.StateComplete {
			t.Fatalf("stored key = %+v; want it absent or released", rec)
		}
		again := postSlow(t, h, "order-1")
		if again.status != http.StatusCreated || again.replayed || b.orders(t, "acme") != 1 {
			t.Fatalf("a retry within the lease = %d replayed=%v %s, orders %d; want a fresh 201 and one order",
				again.status, again.replayed, again.body, b.orders(t, "acme"))
		}
	})
}

// TestIdemLeasedTakeoverAnswersRetryableError: in leased mode, request 1
// outlives its lease; request 2 (same key) takes the key over once the
// lease expired in the database, executes and stores its 201. Request 1
// then answers 201 too: its client must get the retryable 503 instead,
// its work rolled back, and every later duplicate the stored answer of
// request 2.
func TestIdemLeasedTakeoverAnswersRetryableError(t *testing.T) {
	t.Parallel()
	forDrivers(t, func(t *testing.T, drv driver) {
		b := setupOn(t, drv, httpidem.Config{Mode: httpidem.Leased, Inbox: dedupe.Config{Lease: 2 * time.Second}})
		started, proceed := make(chan struct{}, 1), make(chan struct{})
		var release sync.Once
		letGo := func() { release.Do(func() { close(proceed) }) }
		defer letGo() // on failure too: the handler must not outlive the test
		h := b.slowHandler(started, proceed, 1)
		done := make(chan reply, 1)
		go func() { done <- postSlow(t, h, "order-1") }()
		wait(t, started, "request 1's insert")
		b.clock.Advance(3 * time.Second) // request 1's lease expired in the database
		second := postSlow(t, h, "order-1")
		if second.status != http.StatusCreated || second.replayed || !bytes.Contains(second.body, []byte("resp-2")) {
			t.Fatalf("request 2 = %d replayed=%v %s, want a fresh 201 resp-2 (the takeover)", second.status, second.replayed, second.body)
		}
		letGo()
		var first reply
		select {
		case first = <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("request 1 did not answer")
		}
		wantRolledBack(t, "request 1, taken over", first)
		replay := postSlow(t, h, "order-1")
		if replay.status != http.StatusCreated || !replay.replayed || !bytes.Contains(replay.body, []byte("resp-2")) {
			t.Fatalf("replay = %d replayed=%v %s, want request 2's 201", replay.status, replay.replayed, replay.body)
		}
		if got := b.db.Count(t, "SELECT count(*) FROM orders WHERE cart_id = 'resp-1'"); got != 0 {
			t.Fatalf("request 1's order committed (%d rows), want it rolled back", got)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want 1 (request 2's)", got)
		}
	})
}

// TestIdemHandlerFailingAfterItsStatusIsNotStored: the handler writes 201
// before its work; its client goes away, its insert fails (the context
// ended) and it answers with WriteError, after the 201. Or, with its client
// still there, a statement fails after the 201 and it answers 500. Neither
// is stored as a success (before, the key kept 201 with the problem body,
// replayed forever, and the operation could never run again): the work is
// rolled back, the key released, and the retry executes once.
func TestIdemHandlerFailingAfterItsStatusIsNotStored(t *testing.T) {
	t.Parallel()
	for _, gone := range []bool{true, false} {
		name := "statement failed"
		if gone {
			name = "client gone"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forDriversModes(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
				b := setupOn(t, drv, httpidem.Config{Mode: mode})
				started := make(chan struct{}, 1)
				var failFirst = true
				h := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b.calls.Add(1)
					fail := failFirst
					failFirst = false
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated) // before the work
					tx, err := b.requestTx(r.Context())
					if err == nil && fail {
						if gone {
							started <- struct{}{}
							<-r.Context().Done()
						} else {
							_, err = tx.Exec(r.Context(), "SELECT 1/0")
						}
					}
					if err == nil {
						_, err = tx.Exec(r.Context(), `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ('acme', 'c', 1)`)
					}
					if err != nil {
						httpidem.WriteError(w, r, err)
						return
					}
					_, _ = w.Write([]byte(`{"id":1}`))
				}))
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", bytes.NewReader([]byte(`{}`)))
				req.Header.Set("X-Tenant-ID", "acme")
				req.Header.Set("Idempotency-Key", "key-failed")
				w := httptest.NewRecorder()
				served := make(chan struct{})
				go func() { defer close(served); h.ServeHTTP(w, req) }()
				if gone {
					wait(t, started, "the handler's start")
					cancel() // the client hangs up
				}
				wait(t, served, "the first request's end")
				first := toReply(t, w.Result())
				if first.status < 500 {
					t.Fatalf("first = %d %s, want an error", first.status, first.body)
				}
				if !gone {
					wantRolledBack(t, "first", first)
				}
				rec, err := b.mw.Inbox().Lookup(context.Background(), dedupe.Key{Scope: "acme", ID: "key-failed"})
				if err == nil && rec.State == dedupe.StateComplete {
					t.Fatalf("stored key = %+v (result %+v); want nothing stored for a handler that failed", rec, rec.Result)
				} else if err != nil && !errors.Is(err, dedupe.ErrNotFound) {
					t.Fatal(err)
				}
				retry := toReply(t, serve(h, "key-failed"))
				if retry.status != http.StatusCreated || retry.replayed || b.calls.Load() != 2 || b.orders(t, "acme") != 1 {
					t.Fatalf("retry = %d replayed=%v %s, calls %d, orders %d; want one fresh execution",
						retry.status, retry.replayed, retry.body, b.calls.Load(), b.orders(t, "acme"))
				}
			})
		})
	}
}

// serve sends an empty JSON POST with key through h.
func serve(h http.Handler, key string) *http.Response {
	req := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader([]byte(`{}`)))
	req.Header.Set("X-Tenant-ID", "acme")
	req.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}
