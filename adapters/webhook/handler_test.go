package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

const (
	stripeSecret   = "whsec_test_stripe"
	githubSecret   = "gh-secret"
	standardSecret = "whsec_c3RhbmRhcmQgd2ViaG9va3MgdGVzdCBrZXk=" // base64("standard webhooks test key")
	hmacSecret     = "generic-secret"
)

// provider describes one built-in receiver to the table-driven tests.
type provider struct {
	name string
	// handler builds the receiver over inbox.
	handler func(inbox *dedupe.Inbox, cfg webhook.Config, h func(context.Context, pgx.Tx, webhook.Event) error) (*webhook.Handler, error)
	// sign returns a freshly signed delivery of event id.
	sign func(id string) (http.Header, []byte)
	// key is the dedup key of event id; nil means id itself.
	key func(id string) string
}

// keyOf returns the dedup key p claims for event id.
func (p provider) keyOf(id string) string {
	if p.key == nil {
		return id
	}
	return p.key(id)
}

// githubBody is the body of GitHub event id: like GitHub's own, it carries
// the ids of what it reports, so distinct events have distinct bodies.
func githubBody(id string) []byte {
	return []byte(`{"action":"opened","number":1,"pull_request":{"node_id":"` + id + `"}}`)
}

var providers = []provider{
	{
		name: "stripe",
		handler: func(inbox *dedupe.Inbox, cfg webhook.Config, h func(context.Context, pgx.Tx, webhook.Event) error) (*webhook.Handler, error) {
			return webhook.NewStripe(inbox, webhook.StripeConfig{Secrets: []string{stripeSecret}, Config: cfg}, h)
		},
		sign: func(id string) (http.Header, []byte) {
			body := []byte(`{"id":"` + id + `","object":"event","type":"charge.succeeded"}`)
			return http.Header{"Stripe-Signature": {stripeHeader(now, body, stripeSecret)}}, body
		},
	},
	{
		name: "github",
		handler: func(inbox *dedupe.Inbox, cfg webhook.Config, h func(context.Context, pgx.Tx, webhook.Event) error) (*webhook.Handler, error) {
			return webhook.NewGitHub(inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}, Config: cfg}, h)
		},
		sign: func(id string) (http.Header, []byte) {
			body := githubBody(id)
			return http.Header{"X-Hub-Signature-256": {githubHeader(githubSecret, body)},
				"X-Github-Delivery": {id}, "X-Github-Event": {"pull_request"}}, body
		},
		key: func(id string) string { return webhook.GitHubKey(githubBody(id)) },
	},
	{
		name: "standard",
		handler: func(inbox *dedupe.Inbox, cfg webhook.Config, h func(context.Context, pgx.Tx, webhook.Event) error) (*webhook.Handler, error) {
			return webhook.NewStandard(inbox, webhook.StandardConfig{Secrets: []string{standardSecret}, Config: cfg}, h)
		},
		sign: func(id string) (http.Header, []byte) {
			body := []byte(`{"type":"invoice.created","data":{"n":1}}`)
			return http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {strconv.FormatInt(now.Unix(), 10)},
				"Webhook-Signature": {standardHeader(standardSecret, id, now, body)}}, body
		},
	},
	{
		name: "acme",
		handler: func(inbox *dedupe.Inbox, cfg webhook.Config, h func(context.Context, pgx.Tx, webhook.Event) error) (*webhook.Handler, error) {
			return webhook.NewHMAC(inbox, webhook.HMACConfig{
				HMACVerifier: webhook.HMACVerifier{Name: "acme", Secrets: []string{hmacSecret}, SignatureHeader: "X-Acme-Signature",
					Prefix: "sha256=", IDField: "event_id", TypeField: "kind"},
				Config: cfg,
			}, h)
		},
		sign: func(id string) (http.Header, []byte) {
			body := []byte(`{"event_id":"` + id + `","kind":"order.paid"}`)
			return http.Header{"X-Acme-Signature": {githubHeader(hmacSecret, body)}}, body
		},
	},
}

func TestConcurrentDeliveriesOneRow(t *testing.T) {
	t.Parallel()
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var runs atomic.Int64
			h, err := p.handler(b.inbox, webhook.Config{Clock: clock}, func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
				runs.Add(1)
				time.Sleep(30 * time.Millisecond) // hold the claim while the others arrive
				return record(ctx, tx, ev)
			})
			if err != nil {
				t.Fatal(err)
			}
			srv := serve(t, h)
			const n = 20
			statuses, bodies := make([]int, n), make([]string, n)
			together(n, func(i int) {
				hdr, body := p.sign("evt_concurrent")
				statuses[i], bodies[i], _ = post(t, srv.URL, hdr, body)
			})
			counts := map[string]int{}
			for i := range n {
				if statuses[i] != http.StatusOK {
					t.Errorf("delivery %d: %d %q, want 200", i, statuses[i], bodies[i])
				}
				counts[strings.TrimSpace(bodies[i])]++
			}
			if counts["processed"] != 1 || counts["duplicate"] != n-1 {
				t.Errorf("responses = %v, want 1 processed and %d duplicate", counts, n-1)
			}
			if got := b.effects(t); got != 1 {
				t.Errorf("effects = %d, want 1", got)
			}
			if got := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE scope = $1 AND key = $2 AND state = 'complete'",
				webhook.Scope(p.name, "default"), p.keyOf("evt_concurrent")); got != 1 {
				t.Errorf("inbox rows = %d, want 1", got)
			}
			if runs.Load() != 1 {
				t.Errorf("handler ran %d times, want 1", runs.Load())
			}
		})
	}
}

func TestHandlerFailureThenRedelivery(t *testing.T) {
	t.Parallel()
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var calls atomic.Int64
			var errs []error
			var mu sync.Mutex
			h, err := p.handler(b.inbox, webhook.Config{Clock: clock, OnError: func(_ *http.Request, _ int, err error) {
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, err)
			}}, func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
				if err := record(ctx, tx, ev); err != nil {
					return err
				}
				switch calls.Add(1) {
				case 1:
					return errors.New("ledger unavailable") // the row above must roll back
				case 2:
					panic("bug in handler")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			srv := serve(t, h)
			for attempt, want := range []struct {
				status int
				text   string
			}{{500, "handler failed"}, {500, "handler failed"}, {200, "processed"}, {200, "duplicate"}, {200, "duplicate"}} {
				hdr, body := p.sign("evt_flaky")
				status, text, _ := post(t, srv.URL, hdr, body)
				if status != want.status || strings.TrimSpace(text) != want.text {
					t.Fatalf("delivery %d: %d %q, want %d %q", attempt+1, status, text, want.status, want.text)
				}
				wantEffects := 0
				if attempt >= 2 {
					wantEffects = 1
				}
				if got := b.effects(t); got != wantEffects {
					t.Fatalf("after delivery %d: effects = %d, want %d", attempt+1, got, wantEffects)
				}
			}
			if calls.Load() != 3 {
				t.Fatalf("handler ran %d times, want 3", calls.Load())
			}
			if n := b.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = $1", p.keyOf("evt_flaky")); n != 3 {
				t.Fatalf("attempts = %d, want 3", n)
			}
			var he *dedupe.HandlerError
			var pe *dedupe.PanicError
			if len(errs) != 2 || !errors.As(errs[0], &he) || !errors.As(errs[1], &pe) {
				t.Fatalf("OnError got %v, want a *HandlerError then a *PanicError", errs)
			}
		})
	}
}

func TestPoisonedEventKeepsFailing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	p := providers[1]
	h, err := p.handler(b.inbox, webhook.Config{MaxAttempts: 2}, func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
		calls.Add(1)
		return errors.New("cannot handle")
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	for i, want := range []string{"handler failed", "event marked failed", "event marked failed"} {
		hdr, body := p.sign("evt_poison")
		if status, text, _ := post(t, srv.URL, hdr, body); status != 500 || strings.TrimSpace(text) != want {
			t.Fatalf("delivery %d: %d %q, want 500 %q", i+1, status, text, want)
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", calls.Load())
	}
	// An operator releases the key; the provider's next retry is processed.
	if err := b.inbox.Release(context.Background(), dedupe.Key{Scope: h.Scope(), ID: p.keyOf("evt_poison")}); err != nil {
		t.Fatal(err)
	}
	hdr, body := p.sign("evt_poison")
	if status, text, _ := post(t, srv.URL, hdr, body); status != 500 || strings.TrimSpace(text) != "handler failed" || calls.Load() != 3 {
		t.Fatalf("after release: %d %q, handler calls %d; want it to run again", status, text, calls.Load())
	}
}

func TestInFlightDuplicateGets503(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := providers[0]
	var statuses []int
	var mu sync.Mutex
	h, err := p.handler(b.inbox, webhook.Config{Clock: clock, LockTimeout: 100 * time.Millisecond, RetryAfter: 7 * time.Second,
		OnError: func(_ *http.Request, status int, err error) {
			mu.Lock()
			defer mu.Unlock()
			if !errors.Is(err, dedupe.ErrInFlight) {
				t.Errorf("OnError(%d, %v), want ErrInFlight", status, err)
			}
			statuses = append(statuses, status)
		}}, record)
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	ctx := context.Background()

	// Another delivery of the event is inside its transaction, uncommitted.
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if cl, err := b.inbox.Claim(ctx, tx, dedupe.Key{Scope: h.Scope(), ID: "evt_busy"}); err != nil || cl.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("claim = %v, %v", cl, err)
	}
	hdr, body := p.sign("evt_busy")
	start := time.Now()
	status, text, respHdr := post(t, srv.URL, hdr, body)
	if status != http.StatusServiceUnavailable || strings.TrimSpace(text) != "in flight" || respHdr.Get("Retry-After") != "7" {
		t.Fatalf("concurrent duplicate: %d %q Retry-After %q; want 503 in flight, Retry-After 7", status, text, respHdr.Get("Retry-After"))
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("waited %v, want about the lock timeout", waited)
	}
	// The first delivery fails and rolls back: the retry is processed.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if status, text, _ := post(t, srv.URL, hdr, body); status != 200 || strings.TrimSpace(text) != "processed" {
		t.Fatalf("retry: %d %q", status, text)
	}
	if got := b.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	if len(statuses) != 1 || statuses[0] != 503 {
		t.Fatalf("OnError statuses = %v", statuses)
	}
}

// countingDB counts every statement and transaction an inbox starts.
type countingDB struct {
	*pgxpool.Pool
	n atomic.Int64
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) { c.n.Add(1); return c.Pool.Begin(ctx) }
func (c *countingDB) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	c.n.Add(1)
	return c.Pool.BeginTx(ctx, o)
}
func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n.Add(1)
	return c.Pool.Exec(ctx, sql, args...)
}
func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n.Add(1)
	return c.Pool.Query(ctx, sql, args...)
}
func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.Pool.QueryRow(ctx, sql, args...)
}
func (c *countingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n.Add(1)
	return c.Pool.SendBatch(ctx, b)
}

// TestRefusalsDoNoDatabaseWork: every refusal gets its status and typed
// error, touches no key, and is reported to the inbox's Observer.
func TestRefusalsDoNoDatabaseWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := &countingDB{Pool: b.db.Pool}
	var (
		mu      sync.Mutex
		last    error
		refused []dedupe.TransportEvent
	)
	inbox, err := dedupe.New(db, dedupe.Config{Observer: observetest.OnEvent(func(_ context.Context, e dedupe.TransportEvent) {
		mu.Lock()
		refused = append(refused, e)
		mu.Unlock()
	})})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h, err := webhook.NewStripe(inbox, webhook.StripeConfig{Secrets: []string{stripeSecret}, Config: webhook.Config{
		Clock: clock, MaxBodyBytes: 1 << 10,
		OnError: func(_ *http.Request, _ int, err error) { mu.Lock(); last = err; mu.Unlock() },
	}}, func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error { calls.Add(1); return nil })
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	body := []byte(`{"id":"evt_r","type":"x"}`)
	big := []byte(`{"id":"evt_big","pad":"` + strings.Repeat("x", 2<<10) + `"}`)
	cases := []struct {
		name   string
		method string
		header string
		body   []byte
		status int
		text   string
		want   error
	}{
		{"missing signature", "POST", "", body, 400, "missing signature", webhook.ErrMissingSignature},
		{"wrong secret", "POST", stripeHeader(now, body, "whsec_wrong"), body, 400, "invalid signature", webhook.ErrSignatureMismatch},
		{"tampered body", "POST", stripeHeader(now, body, stripeSecret), []byte(`{"id":"evt_r","type":"y"}`), 400, "invalid signature", webhook.ErrSignatureMismatch},
		{"malformed header", "POST", "garbage", body, 400, "malformed signature", webhook.ErrMalformedSignature},
		{"stale timestamp", "POST", stripeHeader(now.Add(-10*time.Minute), body, stripeSecret), body, 400, "timestamp outside tolerance", webhook.ErrStaleTimestamp},
		{"future timestamp", "POST", stripeHeader(now.Add(10*time.Minute), body, stripeSecret), body, 400, "timestamp outside tolerance", webhook.ErrStaleTimestamp},
		{"no event id", "POST", stripeHeader(now, []byte(`{"type":"x"}`), stripeSecret), []byte(`{"type":"x"}`), 400, "malformed event", webhook.ErrMalformedEvent},
		{"id with control char", "POST", stripeHeader(now, []byte(`{"id":"a\u0000b"}`), stripeSecret), []byte(`{"id":"a\u0000b"}`), 400, "malformed event", webhook.ErrMalformedEvent},
		{"too large", "POST", stripeHeader(now, big, stripeSecret), big, 413, "body too large", webhook.ErrBodyTooLarge},
		{"GET", "GET", stripeHeader(now, body, stripeSecret), nil, 405, "method not allowed", webhook.ErrMethodNotAllowed},
		{"PUT", "PUT", stripeHeader(now, body, stripeSecret), body, 405, "method not allowed", webhook.ErrMethodNotAllowed},
	}
	for _, c := range cases {
		req, err := http.NewRequest(c.method, srv.URL, strings.NewReader(string(c.body)))
		if err != nil {
			t.Fatal(err)
		}
		if c.header != "" {
			req.Header.Set("Stripe-Signature", c.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || strings.TrimSpace(string(text)) != c.text {
			t.Errorf("%s: %d %q, want %d %q", c.name, resp.StatusCode, text, c.status, c.text)
		}
		if c.status == 405 && resp.Header.Get("Allow") != "POST" {
			t.Errorf("%s: Allow = %q", c.name, resp.Header.Get("Allow"))
		}
		mu.Lock()
		if !errors.Is(last, c.want) {
			t.Errorf("%s: OnError got %v, want %v", c.name, last, c.want)
		}
		last = nil
		if len(refused) != 1 || refused[0].Name != dedupe.EventRefused || !errors.Is(refused[0].Err, c.want) ||
			refused[0].Message.System != "webhook" || refused[0].Message.Destination != "stripe:default" || refused[0].Key.ID != "" {
			t.Errorf("%s: observed %+v, want one refused event with %v", c.name, refused, c.want)
		}
		refused = nil
		mu.Unlock()
	}
	if n := db.n.Load(); n != 0 {
		t.Fatalf("refusals ran %d database calls, want 0", n)
	}
	if calls.Load() != 0 || b.inboxRows(t) != 0 {
		t.Fatalf("handler calls %d, inbox rows %d; want none", calls.Load(), b.inboxRows(t))
	}
	// The same receiver accepts a good delivery, proving the refusals were
	// not a broken setup.
	if status, text, _ := post(t, srv.URL, http.Header{"Stripe-Signature": {stripeHeader(now, body, stripeSecret)}}, body); status != 200 || db.n.Load() == 0 {
		t.Fatalf("good delivery: %d %q", status, text)
	}
}

// countingReader is an endless body that counts what the server read.
type countingReader struct{ n atomic.Int64 }

func (r *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	r.n.Add(int64(len(p)))
	return len(p), nil
}

func TestOversizedBodyNotReadInFull(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}}, record)
	if err != nil {
		t.Fatal(err)
	}
	// Declared too large: nothing is read.
	declared := &countingReader{}
	req := httptest.NewRequest("POST", "/hook", io.LimitReader(declared, 2<<20))
	req.ContentLength = 2 << 20
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 413 || declared.n.Load() != 0 {
		t.Fatalf("declared 2 MiB: %d after reading %d bytes; want 413 after 0", rec.Code, declared.n.Load())
	}
	// Streamed without a length: reading stops just past the 1 MiB default.
	streamed := &countingReader{}
	req = httptest.NewRequest("POST", "/hook", streamed)
	req.ContentLength = -1
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 413 || streamed.n.Load() > webhook.DefaultMaxBodyBytes+64<<10 {
		t.Fatalf("endless body: %d after reading %d bytes; want 413 after about 1 MiB", rec.Code, streamed.n.Load())
	}
	// Over a real connection, with Content-Length.
	srv := serve(t, h)
	big := []byte(strings.Repeat("x", webhook.DefaultMaxBodyBytes+1))
	if status, text, _ := post(t, srv.URL, http.Header{"X-Hub-Signature-256": {githubHeader(githubSecret, big)}, "X-Github-Delivery": {"d"}}, big); status != 413 {
		t.Fatalf("1 MiB + 1 over the wire: %d %q", status, text)
	}
	// Exactly the limit is accepted.
	exact := []byte(`{"p":"` + strings.Repeat("x", webhook.DefaultMaxBodyBytes-8) + `"}`)
	if status, text, _ := post(t, srv.URL, http.Header{"X-Hub-Signature-256": {githubHeader(githubSecret, exact)}, "X-Github-Delivery": {"d"}}, exact); status != 200 {
		t.Fatalf("exactly 1 MiB: %d %q", status, text)
	}
	if got := b.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

func TestHeaderNameCaseVariants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mux := http.NewServeMux()
	for _, p := range providers[:3] {
		h, err := p.handler(b.inbox, webhook.Config{Clock: clock}, record)
		if err != nil {
			t.Fatal(err)
		}
		mux.Handle("POST /"+p.name, h)
	}
	srv := serve(t, mux)
	variants := []func(string) string{strings.ToLower, strings.ToUpper, func(s string) string { return s }}
	n := 0
	for _, p := range providers[:3] {
		for vi, variant := range variants {
			n++
			hdr, body := p.sign(fmt.Sprintf("evt_case_%d", vi))
			raw := http.Header{}
			for k, v := range hdr {
				raw[variant(k)] = v // sent as written; the server canonicalizes
			}
			if status, text, _ := post(t, srv.URL+"/"+p.name, raw, body); status != 200 || strings.TrimSpace(text) != "processed" {
				t.Errorf("%s, header names %v: %d %q", p.name, keys(raw), status, text)
			}
		}
	}
	if got := b.effects(t); got != n {
		t.Fatalf("effects = %d, want %d", got, n)
	}
}

func keys(h http.Header) []string {
	var ks []string
	for k := range h {
		ks = append(ks, k)
	}
	return ks
}

func TestScopeIsProviderAndEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen sync.Map
	handler := func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
		seen.Store(ev.Endpoint, ev)
		return record(ctx, tx, ev)
	}
	billing, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}, Config: webhook.Config{Endpoint: "billing"}}, handler)
	if err != nil {
		t.Fatal(err)
	}
	ci, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}, Config: webhook.Config{Endpoint: "ci"}}, handler)
	if err != nil {
		t.Fatal(err)
	}
	ciReplica, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}, Config: webhook.Config{Endpoint: "ci"}}, handler)
	if err != nil {
		t.Fatal(err)
	}
	if billing.Scope() != "webhook:github:billing" || ci.Scope() != "webhook:github:ci" {
		t.Fatalf("scopes %q, %q", billing.Scope(), ci.Scope())
	}
	hdr, body := providers[1].sign("same-delivery")
	for i, h := range []http.Handler{billing, ci, ciReplica} {
		srv := serve(t, h)
		want := []string{"processed", "processed", "duplicate"}[i]
		if status, text, _ := post(t, srv.URL, hdr, body); status != 200 || strings.TrimSpace(text) != want {
			t.Fatalf("handler %d: %d %q, want %s", i, status, text, want)
		}
	}
	if got := b.effects(t); got != 2 {
		t.Fatalf("effects = %d, want 2 (one per endpoint)", got)
	}
	v, _ := seen.Load("ci")
	ev := v.(webhook.Event)
	if ev.Provider != "github" || ev.ID != "same-delivery" || ev.Type != "pull_request" || string(ev.Body) != string(body) ||
		ev.Header.Get("X-Hub-Signature-256") == "" {
		t.Fatalf("event = %+v", ev)
	}
}

func TestClientGoneMidHandlerRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered := make(chan struct{}, 1)
	var slow atomic.Bool
	slow.Store(true)
	h, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}}, func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		if slow.Load() {
			entered <- struct{}{}
			<-ctx.Done() // the provider timed out and hung up
			return ctx.Err()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	hdr, body := providers[1].sign("evt_timeout")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(string(body)))
	req.Header = hdr.Clone()
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never ran")
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("request succeeded after the client hung up")
	}
	// The abandoned transaction rolls back; the provider re-sends (a 503
	// while the rollback is still under way is answered by another re-send).
	slow.Store(false)
	deadline := time.Now().Add(15 * time.Second)
	for {
		status, text, _ := post(t, srv.URL, hdr, body)
		if status == 200 && strings.TrimSpace(text) == "processed" {
			break
		}
		if status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("redelivery: %d %q", status, text)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := b.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

func TestConnectionKilledMidTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	app := "victim-" + b.db.Schema
	inbox, err := dedupe.New(b.db.AppPool(t, app, 2), dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h, err := webhook.NewStandard(inbox, webhook.StandardConfig{Secrets: []string{standardSecret}, Config: webhook.Config{Clock: clock}},
		func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
			if err := record(ctx, tx, ev); err != nil {
				return err
			}
			if calls.Add(1) == 1 {
				for _, pid := range b.db.BackendPIDs(t, app) {
					b.db.Terminate(t, pid)
				}
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	hdr, body := providers[2].sign("evt_killed")
	// The database failed, not the handler: 503 with Retry-After, so the
	// provider re-sends.
	if status, text, respHdr := post(t, srv.URL, hdr, body); status != http.StatusServiceUnavailable ||
		strings.TrimSpace(text) != "unavailable" || respHdr.Get("Retry-After") == "" {
		t.Fatalf("delivery on a killed connection: %d %q Retry-After %q, want 503 unavailable with Retry-After", status, text, respHdr.Get("Retry-After"))
	}
	if got := b.effects(t); got != 0 {
		t.Fatalf("effects after kill = %d, want 0", got)
	}
	if status, text, _ := post(t, srv.URL, hdr, body); status != 200 || strings.TrimSpace(text) != "processed" {
		t.Fatalf("redelivery: %d %q", status, text)
	}
	if got := b.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

func TestConstructorsValidateConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nop := func(context.Context, pgx.Tx, webhook.Event) error { return nil }
	attempts := map[string]func() error{
		"stripe without secrets": func() error { _, err := webhook.NewStripe(b.inbox, webhook.StripeConfig{}, nop); return err },
		"stripe empty secret": func() error {
			_, err := webhook.NewStripe(b.inbox, webhook.StripeConfig{Secrets: []string{""}}, nop)
			return err
		},
		"stripe negative tolerance": func() error {
			_, err := webhook.NewStripe(b.inbox, webhook.StripeConfig{Secrets: []string{"s"}, Tolerance: -1}, nop)
			return err
		},
		"github without secrets": func() error { _, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{}, nop); return err },
		"standard not base64": func() error {
			_, err := webhook.NewStandard(b.inbox, webhook.StandardConfig{Secrets: []string{"whsec_%%%"}}, nop)
			return err
		},
		"hmac without secrets": func() error { _, err := webhook.NewHMAC(b.inbox, webhook.HMACConfig{}, nop); return err },
		"hmac bad encoding": func() error {
			_, err := webhook.NewHMAC(b.inbox, webhook.HMACConfig{HMACVerifier: webhook.HMACVerifier{Secrets: []string{"s"}, Encoding: 9}}, nop)
			return err
		},
		"negative body limit": func() error {
			_, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{"s"}, Config: webhook.Config{MaxBodyBytes: -1}}, nop)
			return err
		},
		"negative lock timeout": func() error {
			_, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{"s"}, Config: webhook.Config{LockTimeout: -1}}, nop)
			return err
		},
		"endpoint with control": func() error {
			_, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{"s"}, Config: webhook.Config{Endpoint: "a\nb"}}, nop)
			return err
		},
		"nil handler": func() error {
			_, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{"s"}}, dedupe.HandlerFunc[webhook.Event](nil))
			return err
		},
		"nil inbox": func() error {
			_, err := webhook.NewGitHub(nil, webhook.GitHubConfig{Secrets: []string{"s"}}, nop)
			return err
		},
		"nil verifier": func() error { _, err := webhook.New(b.inbox, nil, webhook.Config{}, nop); return err },
	}
	for name, f := range attempts {
		if err := f(); !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	var ce *dedupe.ConfigError
	if _, err := webhook.NewStripe(b.inbox, webhook.StripeConfig{}, nop); !errors.As(err, &ce) || ce.Field != "Secrets" {
		t.Errorf("ConfigError = %+v", ce)
	}
}

// brokenVerifier fails for a reason of its own, not a refusal.
type brokenVerifier struct{}

func (brokenVerifier) Provider() string { return "broken" }
func (brokenVerifier) Verify(http.Header, []byte, time.Time) (webhook.Event, error) {
	return webhook.Event{}, errors.New("key service offline")
}

func TestCustomVerifierFaultIs500(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := &countingDB{Pool: b.db.Pool}
	inbox, err := dedupe.New(db, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := webhook.New(inbox, brokenVerifier{}, webhook.Config{OnError: func(*http.Request, int, error) {}}, record)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/", strings.NewReader("{}")))
	if rec.Code != 500 || strings.TrimSpace(rec.Body.String()) != "verification failed" || db.n.Load() != 0 {
		t.Fatalf("%d %q after %d database calls; want 500 verification failed and none", rec.Code, rec.Body.String(), db.n.Load())
	}
}
