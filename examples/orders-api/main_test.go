package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// harness runs the real program (run) on a loopback port against a fresh
// schema.
type harness struct {
	db   *dbtest.DB
	url  string
	http *http.Client
}

func start(t *testing.T) *harness {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 2})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dbtest.Background(t, "orders-api", func(ctx context.Context) error { return run(ctx, ln, db.URL, log) })
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections) // before the server stops: cleanups run last first
	h := &harness{db: db, url: "http://" + ln.Addr().String(), http: &http.Client{Transport: base, Timeout: 10 * time.Second}}
	// Wait until the tables exist and the server answers.
	dbtest.WaitFor(t, 10*time.Second, "the server to come up", func() bool {
		resp, err := h.http.Get(h.url + "/orders/00000000-0000-0000-0000-000000000000")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized
	})
	return h
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (h *harness) do(t *testing.T, method, path string, headers map[string]string, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := h.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

func (h *harness) orders(t *testing.T, tenant string) int {
	return h.db.Count(t, "SELECT count(*) FROM orders WHERE tenant_id = $1", tenant)
}

const cart = `{"cart_id": "cart-42", "total_cents": 1900}`

func TestIdempotentOrdersAPI(t *testing.T) {
	t.Parallel()
	h := start(t)
	acme := map[string]string{"X-Tenant-ID": "acme", "Idempotency-Key": "order-1"}

	// Authentication runs first: a 401 is not tied to the key.
	if a := h.do(t, "POST", "/orders", map[string]string{"Idempotency-Key": "order-1"}, cart); a.status != 401 {
		t.Fatalf("no tenant: %d %s, want 401", a.status, a.raw)
	}
	if a := h.do(t, "POST", "/orders", map[string]string{"X-Tenant-ID": "acme"}, cart); a.status != 400 {
		t.Fatalf("no key: %d %s, want 400", a.status, a.raw)
	}

	// Duplicates fired at the same instant create one order.
	const n = 8
	answers := make([]answer, n)
	dbtest.Together(n, func(i int) { answers[i] = h.do(t, "POST", "/orders", acme, cart) })
	var id string
	fresh := 0
	for _, a := range answers {
		switch a.status {
		case 201:
			if a.header.Get("Idempotent-Replayed") != "true" {
				fresh++
			}
			got, _ := a.body["id"].(string)
			if id == "" {
				id = got
			} else if got != id {
				t.Fatalf("two order ids: %s and %s", id, got)
			}
		case 409:
		default:
			t.Fatalf("duplicate answered %d %s", a.status, a.raw)
		}
	}
	if fresh != 1 || id == "" || h.orders(t, "acme") != 1 {
		t.Fatalf("fresh 201s = %d, id %q, orders %d; want one order", fresh, id, h.orders(t, "acme"))
	}
	replay := h.do(t, "POST", "/orders", acme, cart)
	if replay.status != 201 || replay.header.Get("Idempotent-Replayed") != "true" || replay.body["id"] != id ||
		replay.header.Get("Location") != "/orders/"+id {
		t.Fatalf("replay: %d %v %s", replay.status, replay.header, replay.raw)
	}
	if a := h.do(t, "POST", "/orders", acme, `{"cart_id": "cart-42", "total_cents": 2500}`); a.status != 422 {
		t.Fatalf("same key, other body: %d, want 422", a.status)
	}
	other := h.do(t, "POST", "/orders", map[string]string{"X-Tenant-ID": "globex", "Idempotency-Key": "order-1"}, cart)
	if other.status != 201 || other.header.Get("Idempotent-Replayed") != "" || other.body["id"] == id {
		t.Fatalf("other tenant, same key: %d %s, want its own order", other.status, other.raw)
	}
	if h.orders(t, "acme") != 1 || h.orders(t, "globex") != 1 {
		t.Fatal("the tenants' orders are not independent")
	}
	// A validation error is the operation's answer: stored and replayed.
	bad := map[string]string{"X-Tenant-ID": "acme", "Idempotency-Key": "order-bad"}
	if a := h.do(t, "POST", "/orders", bad, `{"cart_id": ""}`); a.status != 400 {
		t.Fatalf("invalid order: %d", a.status)
	}
	if a := h.do(t, "POST", "/orders", bad, `{"cart_id": ""}`); a.status != 400 || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("invalid order replay: %d %v", a.status, a.header)
	}

	// GET and PUT with ETag / If-Match.
	path := "/orders/" + id
	got := h.do(t, "GET", path, map[string]string{"X-Tenant-ID": "acme"}, "")
	if got.status != 200 || got.header.Get("ETag") != `"1"` || got.body["cart_id"] != "cart-42" {
		t.Fatalf("GET: %d %v %s", got.status, got.header, got.raw)
	}
	if a := h.do(t, "GET", path, map[string]string{"X-Tenant-ID": "acme", "If-None-Match": `"1"`}, ""); a.status != 304 {
		t.Fatalf("GET If-None-Match: %d, want 304", a.status)
	}
	if a := h.do(t, "GET", path, map[string]string{"X-Tenant-ID": "globex"}, ""); a.status != 404 {
		t.Fatalf("GET as another tenant: %d, want 404", a.status)
	}
	update := `{"cart_id": "cart-42", "total_cents": 2100}`
	if a := h.do(t, "PUT", path, map[string]string{"X-Tenant-ID": "acme"}, update); a.status != 428 {
		t.Fatalf("PUT without If-Match: %d, want 428", a.status)
	}
	put := h.do(t, "PUT", path, map[string]string{"X-Tenant-ID": "acme", "If-Match": `"1"`}, update)
	if put.status != 200 || put.header.Get("ETag") != `"2"` || put.body["total_cents"] != float64(2100) {
		t.Fatalf("PUT: %d %v %s", put.status, put.header, put.raw)
	}
	if a := h.do(t, "PUT", path, map[string]string{"X-Tenant-ID": "acme", "If-Match": `"1"`}, update); a.status != 412 {
		t.Fatalf("stale PUT: %d, want 412", a.status)
	}
	if a := h.do(t, "PUT", path, map[string]string{"X-Tenant-ID": "globex", "If-Match": `"2"`}, update); a.status != 404 {
		t.Fatalf("PUT as another tenant: %d, want 404", a.status)
	}
}

func TestIdempotentOrdersAPIWithRetryingClient(t *testing.T) {
	t.Parallel()
	h := start(t)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	c, err := httpidem.NewClient(httpidem.TransportConfig{Base: base, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var out order
	rp, err := httpidem.PostJSON(context.Background(), c, h.url+"/orders", map[string]any{"cart_id": "cart-7", "total_cents": 500}, &out,
		httpidem.WithHeader("X-Tenant-ID", "initech"))
	if err != nil || rp.Status != 201 || out.ID == "" || out.TotalCents != 500 {
		t.Fatalf("PostJSON = %+v %+v, %v", rp, out, err)
	}
	// The same logical operation sent again (a client restart that kept
	// its key) gets the same order back.
	var again order
	rp2, err := httpidem.PostJSON(context.Background(), c, h.url+"/orders", map[string]any{"cart_id": "cart-7", "total_cents": 500}, &again,
		httpidem.WithHeader("X-Tenant-ID", "initech"), httpidem.WithKey(rp.Key))
	if err != nil || !rp2.Replayed || again.ID != out.ID {
		t.Fatalf("second PostJSON = %+v %+v, %v; want the replay of %s", rp2, again, err, out.ID)
	}
	_, err = httpidem.PostJSON(context.Background(), c, h.url+"/orders", map[string]any{"cart_id": "cart-7"}, nil,
		httpidem.WithHeader("X-Tenant-ID", "initech"))
	var se *httpidem.StatusError
	if !errors.As(err, &se) || se.Status != 400 {
		t.Fatalf("invalid order: %v, want a 400 StatusError", err)
	}
	if n := h.orders(t, "initech"); n != 1 {
		t.Fatalf("orders = %d, want 1", n)
	}
}
