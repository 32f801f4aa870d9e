package badinput_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// idemEnv is a migrated Idempotency-Key store and a required-key route whose
// handler writes one effect through the request's transaction.
type idemEnv struct {
	*env
	mw      *httpidem.Middleware
	route   http.Handler
	ran     atomic.Int64
	lastErr atomic.Pointer[error]
	// release lets a request with X-Slow leave its handler: it holds its
	// key until the test closes release (or the request ends).
	release chan struct{}
}

func setupIdem(t *testing.T, cfg httpidem.Config) *idemEnv {
	t.Helper()
	ie := &idemEnv{env: setup(t), release: make(chan struct{})}
	cfg.KeyRequired = true
	cfg.MaxRequestBytes = 1024
	if cfg.Tenant == nil {
		cfg.Tenant = func(r *http.Request) (string, error) {
			if v := r.Header.Get("X-Tenant"); v != "" {
				return v, nil
			}
			return "", errors.New("not authenticated")
		}
	}
	cfg.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		ie.lastErr.Store(&err)
		httpidem.WriteError(w, r, err)
	}
	mw, err := httpidem.New(ie.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ie.mw = mw
	ie.route = mw.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ie.ran.Add(1)
		tx, err := httpidem.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if err := effect(r.Context(), tx, httpidem.ClaimFromContext(r.Context()).Key.ID); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if r.Header.Get("X-Slow") != "" {
			select {
			case <-ie.release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	return ie
}

func (ie *idemEnv) keys(t *testing.T) int {
	t.Helper()
	return ie.db.Count(t, "SELECT count(*) FROM "+httpidem.DefaultTable)
}

// do sends one request and returns the status and the refusal's error.
func (ie *idemEnv) do(method, body string, header http.Header) (int, error) {
	ie.lastErr.Store(nil)
	r := httptest.NewRequest(method, "/orders", strings.NewReader(body))
	for k, v := range header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	ie.route.ServeHTTP(w, r)
	var err error
	if p := ie.lastErr.Load(); p != nil {
		err = *p
	}
	return w.Code, err
}

func TestIdempotencyKeyRefusals(t *testing.T) {
	t.Parallel()
	ie := setupIdem(t, httpidem.Config{})
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out[http.CanonicalHeaderKey(kv[i])] = append(out[http.CanonicalHeaderKey(kv[i])], kv[i+1])
		}
		return out
	}
	cases := []struct {
		name   string
		body   string
		header http.Header
		status int
		is     error
	}{
		{"no key on a required route", "{}", h("X-Tenant", "t1"), 400, httpidem.ErrKeyMissing},
		{"empty key", "{}", h("X-Tenant", "t1", "Idempotency-Key", ""), 400, httpidem.ErrKeyMissing},
		{"key of 256 characters", "{}", h("X-Tenant", "t1", "Idempotency-Key", strings.Repeat("k", 256)), 400, httpidem.ErrKeyInvalid},
		{"key with a NUL", "{}", h("X-Tenant", "t1", "Idempotency-Key", "a\x00b"), 400, httpidem.ErrKeyInvalid},
		{"key with a tab", "{}", h("X-Tenant", "t1", "Idempotency-Key", "a\tb"), 400, httpidem.ErrKeyInvalid},
		{"key with DEL", "{}", h("X-Tenant", "t1", "Idempotency-Key", "a\x7f"), 400, httpidem.ErrKeyInvalid},
		{"key not ASCII", "{}", h("X-Tenant", "t1", "Idempotency-Key", "clé"), 400, httpidem.ErrKeyInvalid},
		{"key of invalid UTF-8", "{}", h("X-Tenant", "t1", "Idempotency-Key", "a\xffb"), 400, httpidem.ErrKeyInvalid},
		{"header repeated", "{}", h("X-Tenant", "t1", "Idempotency-Key", "k1", "Idempotency-Key", "k2"), 400, httpidem.ErrKeyInvalid},
		{"no tenant", "{}", h("Idempotency-Key", "k1"), 401, httpidem.ErrNoTenant},
		{"tenant with a control char", "{}", h("X-Tenant", "t\x01", "Idempotency-Key", "k1"), 401, httpidem.ErrNoTenant},
		{"tenant of 256 bytes", "{}", h("X-Tenant", strings.Repeat("t", 256), "Idempotency-Key", "k1"), 401, httpidem.ErrNoTenant},
		{"body over the limit", strings.Repeat("x", 1025), h("X-Tenant", "t1", "Idempotency-Key", "k1"), 413, httpidem.ErrRequestTooLarge},
	}
	for _, c := range cases {
		status, err := ie.do(http.MethodPost, c.body, c.header)
		if status != c.status {
			t.Errorf("%s: status %d, want %d (err %v)", c.name, status, c.status, err)
			continue
		}
		var he *httpidem.Error
		if !errors.Is(err, c.is) || !errors.As(err, &he) || he.Status != c.status || httpidem.StatusCode(err) != c.status {
			t.Errorf("%s: err = %#v, want an *httpidem.Error with status %d matching %v", c.name, err, c.status, c.is)
		}
	}
	if n := ie.ran.Load(); n != 0 {
		t.Errorf("handler ran %d times for refused requests", n)
	}
	if n := ie.keys(t); n != 0 {
		t.Errorf("key rows = %d, want 0: a refused request was tied to its key", n)
	}
	ie.assertNothingWritten(t)

	// ValidateKey refuses the same keys on its own.
	for _, k := range []string{"", strings.Repeat("k", 256), "a\nb", "ключ"} {
		if err := httpidem.ValidateKey(k); err == nil || httpidem.StatusCode(err) != 400 {
			t.Errorf("ValidateKey(%q) = %v, want a 400 refusal", k, err)
		}
	}
	if err := httpidem.ValidateKey(strings.Repeat("k", 255)); err != nil {
		t.Errorf("ValidateKey(255 chars) = %v, want nil", err)
	}
}

// TestIdempotencyKeyReuseAndInFlight: the same key with another body is 422
// and a concurrent request with the same key is 409; neither runs the
// handler, and the stored key is the first request's.
func TestIdempotencyKeyReuseAndInFlight(t *testing.T) {
	t.Parallel()
	ie := setupIdem(t, httpidem.Config{})
	hdr := http.Header{"X-Tenant": {"t1"}, "Idempotency-Key": {"k-1"}}
	slow := http.Header{"X-Tenant": {"t1"}, "Idempotency-Key": {"k-1"}, "X-Slow": {"1"}}
	done := make(chan int, 1)
	go func() {
		status, _ := ie.do(http.MethodPost, `{"total":19}`, slow)
		done <- status
	}()
	deadline := time.Now().Add(5 * time.Second)
	for ie.ran.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	// The first request is inside its handler: the key is in flight.
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"total":19}`))
	r.Header = hdr.Clone()
	w := httptest.NewRecorder()
	ie.route.ServeHTTP(w, r)
	if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Errorf("concurrent duplicate: status %d, Retry-After %q; want 409 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	if p := ie.lastErr.Load(); p == nil || !errors.Is(*p, httpidem.ErrInFlight) {
		t.Errorf("concurrent duplicate: err = %v, want ErrInFlight", p)
	}
	close(ie.release) // the first request ends only now: the key was held throughout
	if status := <-done; status != http.StatusCreated {
		t.Fatalf("first request: status %d, want 201", status)
	}
	status, err := ie.do(http.MethodPost, `{"total":1900}`, hdr)
	if status != http.StatusUnprocessableEntity || !errors.Is(err, httpidem.ErrKeyReused) {
		t.Errorf("same key, other body: status %d, err %v; want 422 ErrKeyReused", status, err)
	}
	if n := ie.ran.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if n := ie.db.Count(t, "SELECT count(*) FROM effects"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if n := ie.keys(t); n != 1 {
		t.Errorf("key rows = %d, want 1", n)
	}
}

func TestIdempotencyConfigRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cases := map[string]struct {
		db  dedupe.DB
		cfg httpidem.Config
	}{
		"nil db":                    {nil, httpidem.Config{}},
		"negative MaxRequestBytes":  {e.db.Pool, httpidem.Config{MaxRequestBytes: -1}},
		"negative MaxResponseBytes": {e.db.Pool, httpidem.Config{MaxResponseBytes: -1}},
		"unknown Oversize policy":   {e.db.Pool, httpidem.Config{Oversize: 99}},
		"unknown ServerErrors":      {e.db.Pool, httpidem.Config{ServerErrors: 99}},
		"negative inbox Lease":      {e.db.Pool, httpidem.Config{Inbox: dedupe.Config{Lease: -time.Second}}},
		"unknown Mode":              {e.db.Pool, httpidem.Config{Mode: 99}},
		"negative LockTimeout":      {e.db.Pool, httpidem.Config{LockTimeout: -time.Second}},
		"Set-Cookie stored":         {e.db.Pool, httpidem.Config{StoredHeaders: []string{"Location", "set-cookie"}}},
		"hop-by-hop header stored":  {e.db.Pool, httpidem.Config{StoredHeaders: []string{"Transfer-Encoding"}}},
		"Connection stored":         {e.db.Pool, httpidem.Config{StoredHeaders: []string{"Connection"}}},
	}
	fields := map[string]string{
		"nil db": "db", "negative MaxRequestBytes": "MaxRequestBytes", "negative MaxResponseBytes": "MaxResponseBytes",
		"unknown Oversize policy": "Oversize", "unknown ServerErrors": "ServerErrors", "negative inbox Lease": "Lease",
		"unknown Mode": "Mode", "negative LockTimeout": "LockTimeout", "Set-Cookie stored": "StoredHeaders",
		"hop-by-hop header stored": "StoredHeaders", "Connection stored": "StoredHeaders",
	}
	for name, c := range cases {
		_, err := httpidem.New(c.db, c.cfg)
		var ce *dedupe.ConfigError
		var dce *dedupe.ConfigError
		if !errors.As(err, &ce) && !errors.As(err, &dce) {
			t.Errorf("%s: err = %v, want a *ConfigError", name, err)
		}
		if field := configField(err); field != fields[name] {
			t.Errorf("%s: err = %v names field %q, want %q", name, err, field, fields[name])
		}
		if ce != nil && !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("%s: err = %v does not match dedupe.ErrInvalidConfig", name, err)
		}
	}
	e.assertNothingWritten(t)
}
