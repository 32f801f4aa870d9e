package httpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
)

var cart = order{CartID: "cart-1", TotalCents: 1900}

func TestIdemConcurrentDuplicatesCreateOneOrder(t *testing.T) {
	t.Parallel()
	forDriversModes(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
		b := setupOn(t, drv, httpidem.Config{Mode: mode})
		const n = 8
		replies := make([]reply, n)
		together(n, func(i int) { replies[i] = b.post(t, "acme", "key-concurrent", cart) })

		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want exactly 1", got)
		}
		if got := b.calls.Load(); got != 1 {
			t.Fatalf("handler ran %d times, want 1", got)
		}
		fresh, replayed, inFlight := countReplies(t, replies, http.StatusCreated)
		if fresh != 1 || fresh+replayed+inFlight != n {
			t.Fatalf("fresh 201 = %d, replayed 201 = %d, 409 = %d; want exactly one fresh 201", fresh, replayed, inFlight)
		}
		t.Logf("fresh %d, replayed %d, in flight %d", fresh, replayed, inFlight)
	})
}

// countReplies sorts concurrent answers to one key into fresh and replayed
// answers with status want (all of the same order) and 409s with
// Retry-After; anything else fails the test.
func countReplies(t *testing.T, replies []reply, want int) (fresh, replayed, inFlight int) {
	t.Helper()
	var body string
	for _, r := range replies {
		switch {
		case r.status == want && !r.replayed:
			fresh++
		case r.status == want && r.replayed:
			replayed++
		case r.status == http.StatusConflict:
			inFlight++
			if r.header.Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After")
			}
			continue
		default:
			t.Fatalf("unexpected answer %d replayed=%v %s", r.status, r.replayed, r.body)
		}
		if body == "" {
			body = string(r.body)
		} else if string(r.body) != body {
			t.Fatalf("two different answers: %s and %s", body, r.body)
		}
	}
	return fresh, replayed, inFlight
}

func TestReplayCarriesStoredResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.post(t, "acme", "key-replay", cart)
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("first = %d replayed=%v, want fresh 201", first.status, first.replayed)
	}
	if first.header.Get("X-Not-Stored") != "1" {
		t.Fatalf("first response lost a header: %v", first.header)
	}
	second := b.post(t, "acme", "key-replay", cart)
	if second.status != http.StatusCreated || !second.replayed {
		t.Fatalf("second = %d replayed=%v, want replayed 201", second.status, second.replayed)
	}
	if string(second.body) != string(first.body) || second.id != first.id {
		t.Fatalf("replayed body %q, want %q", second.body, first.body)
	}
	for _, h := range []string{"Location", "Content-Type"} {
		if second.header.Get(h) != first.header.Get(h) {
			t.Errorf("replayed %s = %q, want %q", h, second.header.Get(h), first.header.Get(h))
		}
	}
	if second.header.Get("X-Not-Stored") != "" {
		t.Errorf("a header outside StoredHeaders was replayed")
	}
	if got := b.orders(t, "acme"); got != 1 {
		t.Fatalf("orders = %d, want 1", got)
	}
}

func TestSameKeyOtherRequestIs422(t *testing.T) {
	t.Parallel()
	forDrivers(t, func(t *testing.T, drv driver) {
		b := setupOn(t, drv)
		if r := b.post(t, "acme", "key-422", cart); r.status != http.StatusCreated {
			t.Fatalf("first = %d", r.status)
		}
		other := cart
		other.TotalCents = 2500
		r := b.post(t, "acme", "key-422", other)
		if r.status != http.StatusUnprocessableEntity || r.replayed {
			t.Fatalf("other body = %d replayed=%v %s, want 422", r.status, r.replayed, r.body)
		}
		// Another path with the same key and body is another request too.
		req := httptest.NewRequest(http.MethodPost, "/refunds", strings.NewReader(`{"cart_id":"cart-1","total_cents":1900}`))
		req.Header.Set("X-Tenant-ID", "acme")
		req.Header.Set("Idempotency-Key", "key-422")
		w := httptest.NewRecorder()
		b.handler.ServeHTTP(w, req)
		if w.Code != http.StatusUnprocessableEntity {
			t.Fatalf("other path = %d, want 422", w.Code)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want 1", got)
		}
	})
}

func TestSameKeyOtherTenantIsIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var a, c reply
	together(2, func(i int) {
		if i == 0 {
			a = b.post(t, "acme", "shared-key", cart)
		} else {
			c = b.post(t, "globex", "shared-key", cart)
		}
	})
	for _, r := range []reply{a, c} {
		if r.status != http.StatusCreated || r.replayed {
			t.Fatalf("answer %d replayed=%v, want fresh 201 for each tenant", r.status, r.replayed)
		}
	}
	if a.id == c.id {
		t.Fatalf("both tenants got order %d", a.id)
	}
	if b.orders(t, "acme") != 1 || b.orders(t, "globex") != 1 {
		t.Fatalf("orders acme=%d globex=%d, want 1 each", b.orders(t, "acme"), b.orders(t, "globex"))
	}
}

// TestIdemServerErrorIsRolledBackStoredAndReplayed: a 5xx or a panic rolls
// the handler's work back and stores the error response; concurrent
// duplicates get it replayed (or 409), and the handler runs once.
func TestIdemServerErrorIsRolledBackStoredAndReplayed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   order
	}{
		{"500", order{CartID: "c", TotalCents: 1, Fail: true}},
		{"panic", order{CartID: "c", TotalCents: 1, Panic: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			forDriversModes(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
				b := setupOn(t, drv, httpidem.Config{Mode: mode})
				const n = 6
				replies := make([]reply, n)
				together(n, func(i int) { replies[i] = b.post(t, "acme", "key-err", tc.in) })
				fresh, _, _ := countReplies(t, replies, http.StatusInternalServerError)
				if fresh != 1 {
					t.Fatalf("fresh 500s = %d, want 1", fresh)
				}
				if got := b.orders(t, "acme"); got != 0 {
					t.Fatalf("orders = %d after a 5xx, want 0 (rolled back)", got)
				}
				second := b.post(t, "acme", "key-err", tc.in)
				if second.status != http.StatusInternalServerError || !second.replayed {
					t.Fatalf("second = %d replayed=%v %q, want the stored 500", second.status, second.replayed, second.body)
				}
				if got := b.calls.Load(); got != 1 {
					t.Fatalf("handler ran %d times, want 1", got)
				}
				rec, err := b.mw.Inbox().Lookup(context.Background(), dedupe.Key{Scope: "acme", ID: "key-err"})
				if err != nil || rec.State != dedupe.StateComplete || rec.Result.Status != 500 {
					t.Fatalf("stored key = %+v, %v; want complete with 500", rec, err)
				}
			})
		})
	}
}

func TestRetryServerErrorsReleasesTheKey(t *testing.T) {
	t.Parallel()
	forDriversModes(t, testRetryServerErrorsReleasesTheKey)
}

func testRetryServerErrorsReleasesTheKey(t *testing.T, drv driver, mode httpidem.Mode) {
	b := setupOn(t, drv, httpidem.Config{ServerErrors: httpidem.RetryServerErrors, Mode: mode})
	if r := b.post(t, "acme", "key-retry", order{CartID: "c", Fail: true}); r.status != 500 {
		t.Fatalf("first = %d, want 500", r.status)
	}
	r := b.post(t, "acme", "key-retry", order{CartID: "c", Fail: true})
	if r.status != 500 || r.replayed {
		t.Fatalf("second = %d replayed=%v, want a fresh 500", r.status, r.replayed)
	}
	if got := b.calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2", got)
	}
	if got := b.orders(t, "acme"); got != 0 {
		t.Fatalf("orders = %d, want 0", got)
	}
}

// TestLeaseExpiryLetsRetryExecute: leased mode only (in transactional mode
// a hung holder keeps its transaction, and duplicates get 409, until its
// request context, bounded by the lease, ends).
func TestLeaseExpiryLetsRetryExecute(t *testing.T) {
	t.Parallel()
	forDrivers(t, func(t *testing.T, drv driver) {
		b := setupOn(t, drv, httpidem.Config{Mode: httpidem.Leased})
		blockedOrder := cart
		blockedOrder.Block = true
		var stale reply
		var wg sync.WaitGroup
		wg.Go(func() { stale = b.post(t, "acme", "key-lease", blockedOrder) })
		select {
		case <-b.blocked:
		case <-time.After(10 * time.Second):
			t.Fatal("the first request never reached the handler")
		}
		// While the first holder's lease is live a retry is refused.
		if r := b.post(t, "acme", "key-lease", blockedOrder); r.status != http.StatusConflict {
			t.Fatalf("retry during the lease = %d, want 409", r.status)
		}
		// The holder hangs (as a process that died would); its lease runs out.
		b.clock.Advance(httpidem.DefaultLease + time.Second)
		fresh := b.post(t, "acme", "key-lease", cart)
		// cart differs from blockedOrder in its body: a takeover must match the
		// fingerprint, so send the same body.
		if fresh.status != http.StatusUnprocessableEntity {
			t.Fatalf("takeover with another body = %d, want 422", fresh.status)
		}
		var retry reply
		wg.Go(func() { retry = b.post(t, "acme", "key-lease", blockedOrder) })
		select {
		case <-b.blocked: // the retry executes the handler
		case <-time.After(10 * time.Second):
			t.Fatal("the retry after lease expiry did not execute")
		}
		// Wake both: the stale holder's completion must be refused.
		close(b.unblock)
		wg.Wait()
		if retry.status != http.StatusCreated || retry.replayed {
			t.Fatalf("retry after lease expiry = %d replayed=%v %s, want fresh 201", retry.status, retry.replayed, retry.body)
		}
		if stale.status != http.StatusConflict {
			t.Fatalf("stale holder answered %d %s, want 409 (lease lost)", stale.status, stale.body)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want exactly 1", got)
		}
		if r := b.post(t, "acme", "key-lease", blockedOrder); r.status != http.StatusCreated || !r.replayed || r.id != retry.id {
			t.Fatalf("after both = %d replayed=%v id=%d, want replay of %d", r.status, r.replayed, r.id, retry.id)
		}
	})
}

func TestKilledConnectionRollsBackAndReleases(t *testing.T) {
	t.Parallel()
	forDriversModes(t, testKilledConnectionRollsBackAndReleases)
}

func testKilledConnectionRollsBackAndReleases(t *testing.T, drv driver, mode httpidem.Mode) {
	b := setupOn(t, drv, httpidem.Config{Mode: mode})
	kill := cart
	kill.Kill = true
	r := b.post(t, "acme", "key-kill", kill)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("answer after pg_terminate_backend = %d %s, want 503", r.status, r.body)
	}
	if got := b.orders(t, "acme"); got != 0 {
		t.Fatalf("orders = %d, want 0", got)
	}
	// The key was released, so the same request executes again (the fault
	// is injected once).
	r = b.post(t, "acme", "key-kill", kill)
	if r.status != http.StatusCreated || r.replayed {
		t.Fatalf("retry = %d replayed=%v %s, want fresh 201", r.status, r.replayed, r.body)
	}
	if got := b.orders(t, "acme"); got != 1 {
		t.Fatalf("orders = %d, want 1", got)
	}
}

func TestKeyValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	required := b.mw.Required().Handler(http.HandlerFunc(b.createOrder))
	for _, tc := range []struct {
		name   string
		h      http.Handler
		keys   []string
		tenant string
		method string
		want   int
	}{
		{"missing where required", required, nil, "acme", http.MethodPost, 400},
		{"too long", b.handler, []string{strings.Repeat("k", 256)}, "acme", http.MethodPost, 400},
		{"control character", b.handler, []string{"key\x01"}, "acme", http.MethodPost, 400},
		{"tab", b.handler, []string{"key\tx"}, "acme", http.MethodPost, 400},
		{"not ASCII", b.handler, []string{"kéy"}, "acme", http.MethodPost, 400},
		{"repeated header", b.handler, []string{"a", "b"}, "acme", http.MethodPost, 400},
		{"no tenant", b.handler, []string{"key-no-tenant"}, "", http.MethodPost, 401},
		{"longest key", b.handler, []string{strings.Repeat("k", 255)}, "acme", http.MethodPost, 201},
		{"printable punctuation", b.handler, []string{"~ !key-#1 "}, "acme", http.MethodPost, 201},
	} {
		req := httptest.NewRequest(tc.method, "/orders", strings.NewReader(`{"cart_id":"v","total_cents":1}`))
		if tc.tenant != "" {
			req.Header.Set("X-Tenant-ID", tc.tenant)
		}
		for _, k := range tc.keys {
			req.Header.Add("Idempotency-Key", k)
		}
		w := httptest.NewRecorder()
		tc.h.ServeHTTP(w, req)
		if w.Code != tc.want {
			t.Errorf("%s: status %d %s, want %d", tc.name, w.Code, w.Body, tc.want)
		}
		if tc.want >= 400 && !strings.HasPrefix(w.Header().Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s: refusal is %q, want a problem document", tc.name, w.Header().Get("Content-Type"))
		}
	}
	// A request refused before the handler is not tied to its key.
	if _, err := b.mw.Inbox().Lookup(context.Background(), dedupe.Key{Scope: "acme", ID: "key-no-tenant"}); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("refused key was recorded: %v", err)
	}
	if got := b.calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2 (the valid keys only)", got)
	}
}

func TestRequestsOutsideTheLayerPassThrough(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var sawTx error
	h := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, sawTx = httpidem.Tx(r.Context())
		w.WriteHeader(http.StatusNoContent)
	}))
	for _, tc := range []struct {
		method, key string
	}{{http.MethodPost, ""}, {http.MethodGet, "key-get"}, {http.MethodPut, "key-put"}} {
		sawTx = nil
		req := httptest.NewRequest(tc.method, "/orders", nil)
		req.Header.Set("X-Tenant-ID", "acme")
		if tc.key != "" {
			req.Header.Set("Idempotency-Key", tc.key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusNoContent || w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s key=%q: %d, want the handler's 204", tc.method, tc.key, w.Code)
		}
		if !errors.Is(sawTx, httpidem.ErrNoTx) {
			t.Fatalf("%s key=%q: Tx = %v, want ErrNoTx", tc.method, tc.key, sawTx)
		}
	}
	st, err := b.mw.Inbox().Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 0 {
		t.Fatalf("keys recorded for pass-through requests: %+v", st)
	}
}

func TestRequestTooLargeIs413(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{MaxRequestBytes: 64})
	r := b.post(t, "acme", "key-413", order{CartID: strings.Repeat("c", 100)})
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", r.status)
	}
	if b.calls.Load() != 0 {
		t.Fatal("handler ran for an oversized request")
	}
}

func TestOversizeResponse(t *testing.T) {
	t.Parallel()
	forDriversModes(t, testOversizeResponse)
}

func testOversizeResponse(t *testing.T, drv driver, mode httpidem.Mode) {
	t.Run("refuse", func(t *testing.T) {
		t.Parallel()
		b := setupOn(t, drv, httpidem.Config{MaxResponseBytes: 512, Mode: mode})
		big := order{CartID: "c", Big: 1000}
		r := b.post(t, "acme", "key-big", big)
		if r.status != http.StatusInternalServerError || !strings.Contains(string(r.body), "over 512 bytes") {
			t.Fatalf("status %d %s, want 500 naming the limit", r.status, r.body)
		}
		if got := b.orders(t, "acme"); got != 0 {
			t.Fatalf("orders = %d, want 0 (rolled back)", got)
		}
		// Released: a retry executes (and is refused again), it is not replayed.
		r = b.post(t, "acme", "key-big", big)
		if r.replayed || b.calls.Load() != 2 {
			t.Fatalf("retry replayed=%v calls=%d, want a second execution", r.replayed, b.calls.Load())
		}
	})
	t.Run("store head", func(t *testing.T) {
		t.Parallel()
		b := setupOn(t, drv, httpidem.Config{MaxResponseBytes: 512, Oversize: httpidem.OversizeStoreHead, Mode: mode})
		big := order{CartID: "c", Big: 1000}
		first := b.post(t, "acme", "key-big", big)
		if first.status != http.StatusCreated || len(first.body) < 1000 {
			t.Fatalf("first = %d with %d bytes, want 201 with the full body", first.status, len(first.body))
		}
		second := b.post(t, "acme", "key-big", big)
		if second.status != http.StatusCreated || !second.replayed || len(second.body) != 0 ||
			second.header.Get("Idempotent-Body-Omitted") != "true" || second.header.Get("Location") != first.header.Get("Location") {
			t.Fatalf("replay = %d replayed=%v body=%d headers=%v, want 201 without body, with Location", second.status, second.replayed, len(second.body), second.header)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want 1", got)
		}
	})
}

func TestPurgeForgetsExpiredKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.post(t, "acme", "key-purge", cart)
	if n, err := b.mw.Purge(context.Background()); err != nil || n != 0 {
		t.Fatalf("purge before expiry = %d, %v; want 0", n, err)
	}
	b.clock.Advance(httpidem.DefaultRetention + time.Minute)
	if n, err := b.mw.Purge(context.Background()); err != nil || n != 1 {
		t.Fatalf("purge after expiry = %d, %v; want 1", n, err)
	}
	again := b.post(t, "acme", "key-purge", cart)
	if again.status != http.StatusCreated || again.replayed || again.id == first.id {
		t.Fatalf("after purge = %d replayed=%v, want a new execution", again.status, again.replayed)
	}
}

func TestRunPurgerStopsWithContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.post(t, "acme", "key-runpurge", cart)
	b.clock.Advance(httpidem.DefaultRetention + time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.mw.RunPurger(ctx, 10*time.Millisecond) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := b.mw.Inbox().Lookup(context.Background(), dedupe.Key{Scope: "acme", ID: "key-runpurge"}); errors.Is(err, dedupe.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("RunPurger did not purge the expired key")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("RunPurger returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RunPurger did not stop")
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, cfg := range []httpidem.Config{
		{MaxRequestBytes: -1},
		{MaxResponseBytes: -1},
		{Oversize: 7},
		{ServerErrors: 7},
		{Inbox: dedupe.Config{Lease: time.Hour, Retention: time.Minute}},
		{Mode: 7},
		{LockTimeout: -time.Second},
		{StoredHeaders: []string{"Content-Type", "Set-Cookie"}},
		{StoredHeaders: []string{"set-cookie"}},
		{StoredHeaders: []string{"Connection"}},
		{StoredHeaders: []string{"transfer-encoding"}},
		{StoredHeaders: []string{"Keep-Alive"}},
		{StoredHeaders: []string{"Upgrade"}},
		{StoredHeaders: []string{"TE"}},
		{StoredHeaders: []string{"Trailer"}},
		{StoredHeaders: []string{"Proxy-Authenticate"}},
		{StoredHeaders: []string{""}},
		{TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}},
	} {
		if _, err := httpidem.New(b.db.Pool, cfg); err == nil {
			t.Errorf("New(%+v) accepted an invalid config", cfg)
		}
	}
	if _, err := httpidem.New(nil, httpidem.Config{}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Errorf("New(nil) = %v, want ErrInvalidConfig", err)
	}
	got := b.mw.Config()
	if got.Inbox.Lease != 90*time.Second || got.Inbox.Retention != 24*time.Hour || got.Header != "Idempotency-Key" ||
		got.Mode != httpidem.Transactional || got.LockTimeout != 100*time.Millisecond {
		t.Errorf("defaults = lease %v retention %v header %q mode %v lock timeout %v", got.Inbox.Lease, got.Inbox.Retention,
			got.Header, got.Mode, got.LockTimeout)
	}
}

func TestAbortedHandlerReleasesTheKey(t *testing.T) {
	t.Parallel()
	forDriversModes(t, testAbortedHandlerReleasesTheKey)
}

func testAbortedHandlerReleasesTheKey(t *testing.T, drv driver, mode httpidem.Mode) {
	b := setupOn(t, drv, httpidem.Config{Mode: mode})
	abort := cart
	abort.Abort = true
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want http.ErrAbortHandler passed on to net/http", v)
			}
		}()
		b.post(t, "acme", "key-abort", abort)
	}()
	if got := b.orders(t, "acme"); got != 0 {
		t.Fatalf("orders = %d after an abort, want 0", got)
	}
	r := b.post(t, "acme", "key-abort", abort)
	if r.status != http.StatusCreated || r.replayed || b.calls.Load() != 2 || b.orders(t, "acme") != 1 {
		t.Fatalf("retry = %d replayed=%v calls=%d orders=%d, want one fresh execution", r.status, r.replayed, b.calls.Load(), b.orders(t, "acme"))
	}
}

func TestClientGoneReleasesTheKey(t *testing.T) {
	t.Parallel()
	forDriversModes(t, testClientGoneReleasesTheKey)
}

func testClientGoneReleasesTheKey(t *testing.T, drv driver, mode httpidem.Mode) {
	b := setupOn(t, drv, httpidem.Config{Mode: mode})
	wait := cart
	wait.WaitCtx = true
	payload, _ := json.Marshal(wait)
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", bytes.NewReader(payload))
	req.Header.Set("X-Tenant-ID", "acme")
	req.Header.Set("Idempotency-Key", "key-gone")
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { defer close(done); b.handler.ServeHTTP(w, req) }()
	select {
	case <-b.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start")
	}
	cancel() // the client hangs up mid-request
	<-done
	// The 500 caused by the cancellation is not the operation's answer: it
	// is not stored, and the retry executes.
	r := b.post(t, "acme", "key-gone", wait)
	if r.status != http.StatusCreated || r.replayed || b.calls.Load() != 2 || b.orders(t, "acme") != 1 {
		t.Fatalf("retry = %d replayed=%v %s calls=%d orders=%d, want one fresh execution", r.status, r.replayed, r.body, b.calls.Load(), b.orders(t, "acme"))
	}
}

func TestFingerprintWithHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{Fingerprint: httpidem.FingerprintWithHeaders("X-Api-Version")})
	send := func(version, trace string) int {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"cart_id":"c","total_cents":1}`))
		req.Header.Set("X-Tenant-ID", "acme")
		req.Header.Set("Idempotency-Key", "key-fp")
		req.Header.Set("X-Api-Version", version)
		req.Header.Set("Traceparent", trace)
		w := httptest.NewRecorder()
		b.handler.ServeHTTP(w, req)
		return w.Code
	}
	if got := send("2026-01", "t1"); got != 201 {
		t.Fatalf("first = %d", got)
	}
	if got := send("2026-01", "t2"); got != 201 {
		t.Fatalf("same request, another trace header = %d, want the replayed 201", got)
	}
	if got := send("2026-02", "t1"); got != 422 {
		t.Fatalf("another API version = %d, want 422", got)
	}
	if b.calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", b.calls.Load())
	}
}

func TestMethodsTheLayerAppliesTo(t *testing.T) {
	t.Parallel()
	send := func(h http.Handler, method, key string) reply {
		req := httptest.NewRequest(method, "/orders", strings.NewReader(`{"cart_id":"m","total_cents":1}`))
		req.Header.Set("X-Tenant-ID", "acme")
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return toReply(t, w.Result())
	}
	// PATCH is claimed by default, like POST: its retry is replayed.
	b := setup(t)
	for i, wantReplayed := range []bool{false, true} {
		if r := send(b.handler, http.MethodPatch, "key-patch"); r.status != http.StatusCreated || r.replayed != wantReplayed {
			t.Fatalf("PATCH %d = %d replayed=%v, want 201 replayed=%v", i+1, r.status, r.replayed, wantReplayed)
		}
	}
	if got := b.calls.Load(); got != 1 {
		t.Fatalf("PATCH handler ran %d times, want 1", got)
	}
	// Configured methods replace the default ones.
	b = setup(t, httpidem.Config{Methods: []string{"put"}})
	for i, wantReplayed := range []bool{false, true} {
		if r := send(b.handler, http.MethodPut, "key-put"); r.status != http.StatusCreated || r.replayed != wantReplayed {
			t.Fatalf("PUT %d = %d replayed=%v, want 201 replayed=%v", i+1, r.status, r.replayed, wantReplayed)
		}
	}
	for i := range 2 {
		if r := send(b.handler, http.MethodPost, "key-post"); r.status != http.StatusInternalServerError || r.replayed {
			// Outside the layer the handler has no transaction: its 500 says
			// so, and it is never replayed.
			t.Fatalf("POST %d = %d replayed=%v %s, want the handler's own 500 (no Tx)", i+1, r.status, r.replayed, r.body)
		}
	}
	if got := b.calls.Load(); got != 3 {
		t.Fatalf("handler ran %d times, want 3 (one PUT, two POSTs)", got)
	}
}

// countingDB counts the round trips, transactions and commits the
// middleware sends through the pool, its transactions' included: every
// statement, batch, BEGIN, COMMIT and ROLLBACK is one round trip (a batch
// begun with Batch.BeginTx carries its BEGIN).
type countingDB struct {
	*pgxpool.Pool
	roundTrips, begins, commits atomic.Int64
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

func (c *countingDB) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	c.roundTrips.Add(1)
	c.begins.Add(1)
	tx, err := c.Pool.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return &countingTx{Tx: tx, c: c}, nil
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.roundTrips.Add(1)
	return c.Pool.Exec(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.roundTrips.Add(1)
	return c.Pool.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.roundTrips.Add(1)
	return c.Pool.QueryRow(ctx, sql, args...)
}

func (c *countingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.roundTrips.Add(1)
	br := c.Pool.SendBatch(ctx, b)
	if tx := br.Tx(); tx != nil {
		c.begins.Add(1)
		return countingBatch{BatchResults: br, tx: &countingTx{Tx: tx, c: c}}
	}
	return br
}

func (c *countingDB) reset() { c.roundTrips.Store(0); c.begins.Store(0); c.commits.Store(0) }

func (c *countingDB) counts() (roundTrips, begins, commits int64) {
	return c.roundTrips.Load(), c.begins.Load(), c.commits.Load()
}

type countingBatch struct {
	pgx.BatchResults
	tx pgx.Tx
}

func (b countingBatch) Tx() pgx.Tx { return b.tx }

type countingTx struct {
	pgx.Tx
	c *countingDB
}

func (t *countingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.c.roundTrips.Add(1)
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *countingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.c.roundTrips.Add(1)
	return t.Tx.Query(ctx, sql, args...)
}

func (t *countingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.c.roundTrips.Add(1)
	return t.Tx.QueryRow(ctx, sql, args...)
}

func (t *countingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.c.roundTrips.Add(1)
	return t.Tx.SendBatch(ctx, b)
}

func (t *countingTx) Commit(ctx context.Context) error {
	t.c.roundTrips.Add(1)
	t.c.commits.Add(1)
	return t.Tx.Commit(ctx)
}

func (t *countingTx) Rollback(ctx context.Context) error {
	t.c.roundTrips.Add(1)
	return t.Tx.Rollback(ctx)
}

// TestHotPathCost pins the database work of the two common cases, in round
// trips. Transactional mode (the default): a new key is one transaction with
// one commit, four round trips: BEGIN with the claim, the handler's INSERT,
// the stored response, COMMIT; a replay right after new keys is the claim's
// round trip, the read of the key it found taken and its ROLLBACK, and a
// replay after that one (the inbox met a duplicate) sends the read with the
// claim: two round trips. Leased mode: a new key is the claim (autocommitted:
// a second commit) and a transaction of BEGIN, INSERT, the stored response
// and COMMIT, five round trips; a replay is one round trip.
func TestHotPathCost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode                                httpidem.Mode
		newTrips, newBegins, newCommits     int64
		replayTrips, replayBegins, replayCs int64
		againTrips                          int64 // the second replay
	}{
		{httpidem.Transactional, 4, 1, 1, 3, 1, 0, 2},
		{httpidem.Leased, 5, 1, 1, 1, 0, 0, 1},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			db := &countingDB{Pool: b.db.Pool}
			mw, err := httpidem.New(db, httpidem.Config{
				Mode:   tc.mode,
				Inbox:  dedupe.Config{Clock: b.clock.Now},
				Tenant: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant-ID"), nil },
				Logger: testLogger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			b.handler = mw.Handler(http.HandlerFunc(b.createOrder))

			// The same key three times: new, then replayed twice.
			for _, req := range []struct {
				name                  string
				replayed              bool
				trips, begins, commit int64
			}{
				{"new key", false, tc.newTrips, tc.newBegins, tc.newCommits},
				{"replay", true, tc.replayTrips, tc.replayBegins, tc.replayCs},
				{"second replay", true, tc.againTrips, tc.replayBegins, tc.replayCs},
			} {
				db.reset()
				if r := b.post(t, "acme", "key-cost", cart); r.status != http.StatusCreated || r.replayed != req.replayed {
					t.Fatalf("%s = %d replayed=%v %s", req.name, r.status, r.replayed, r.body)
				}
				if rt, bg, c := db.counts(); rt != req.trips || bg != req.begins || c != req.commit {
					t.Fatalf("%s: %d round trips, %d transactions, %d commits; want %d, %d, %d",
						req.name, rt, bg, c, req.trips, req.begins, req.commit)
				}
			}
		})
	}
}
