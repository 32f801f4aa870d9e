package httpidem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// attemptLog records what the server saw of each attempt.
type attemptLog struct {
	mu       sync.Mutex
	keys     []string
	ids      []string
	bodies   []string
	attempts int
}

func (l *attemptLog) record(r *http.Request) int {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keys = append(l.keys, r.Header.Get("Idempotency-Key"))
	l.ids = append(l.ids, r.Header.Get("X-Request-Id"))
	l.bodies = append(l.bodies, string(body))
	l.attempts++
	return l.attempts
}

func (l *attemptLog) check(t *testing.T, wantAttempts int, wantKey bool) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.attempts != wantAttempts {
		t.Fatalf("server saw %d attempts, want %d", l.attempts, wantAttempts)
	}
	seen := map[string]bool{}
	for i := range l.keys {
		if wantKey && (l.keys[i] == "" || l.keys[i] != l.keys[0]) {
			t.Fatalf("attempt %d carried key %q, attempt 1 %q: the key must be kept across retries", i+1, l.keys[i], l.keys[0])
		}
		if !wantKey && l.keys[i] != "" {
			t.Fatalf("attempt %d carried key %q, want none", i+1, l.keys[i])
		}
		if l.ids[i] == "" || seen[l.ids[i]] || l.ids[i] == l.keys[i] {
			t.Fatalf("attempt %d request id %q: want a fresh id per attempt, distinct from the key", i+1, l.ids[i])
		}
		seen[l.ids[i]] = true
		if l.bodies[i] != l.bodies[0] {
			t.Fatalf("attempt %d body %q differs from %q", i+1, l.bodies[i], l.bodies[0])
		}
	}
}

// serveAttempts serves answer on loopback, logging every attempt first (n
// counts them from 1), and returns the log, the server's URL and a retrying
// client for it with short backoffs.
func serveAttempts(t *testing.T, cfg httpidem.TransportConfig, answer func(n int, w http.ResponseWriter, r *http.Request)) (*attemptLog, string, *http.Client) {
	t.Helper()
	log := &attemptLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { answer(log.record(r), w, r) }))
	base := &http.Transport{}
	t.Cleanup(func() {
		base.CloseIdleConnections()
		srv.Close()
	})
	cfg.Base = base
	if cfg.InitialBackoff == 0 {
		cfg.InitialBackoff = time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 20 * time.Millisecond
	}
	c, err := httpidem.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return log, srv.URL, c
}

// hangUp closes the connection without an answer.
func hangUp(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	_ = conn.Close()
}

func TestClientKeepsKeyWhenCommittedResponseIsDropped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var committed reply
	log, url, c := serveAttempts(t, httpidem.TransportConfig{MaxAttempts: 3}, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			// Run the request to completion (the order and its stored
			// response commit), then lose the answer.
			rec := httptest.NewRecorder()
			b.handler.ServeHTTP(rec, r)
			committed = toReply(t, rec.Result())
			hangUp(t, w)
			return
		}
		b.handler.ServeHTTP(w, r)
	})

	var out struct{ ID int64 }
	rp, err := httpidem.PostJSON(context.Background(), c, url+"/orders", cart, &out, httpidem.WithHeader("X-Tenant-ID", "acme"))
	if err != nil {
		t.Fatalf("PostJSON: %v", err)
	}
	if committed.status != http.StatusCreated {
		t.Fatalf("the dropped attempt answered %d %s", committed.status, committed.body)
	}
	if rp.Status != http.StatusCreated || !rp.Replayed || out.ID != committed.id {
		t.Fatalf("reply %d replayed=%v id=%d, want the replayed 201 of order %d", rp.Status, rp.Replayed, out.ID, committed.id)
	}
	log.check(t, 2, true)
	if log.keys[0] != rp.Key {
		t.Fatalf("reply key %q, sent %q", rp.Key, log.keys[0])
	}
	if got := b.orders(t, "acme"); got != 1 {
		t.Fatalf("orders = %d, want exactly 1", got)
	}
}

func TestClientRetriesRetryableStatuses(t *testing.T) {
	t.Parallel()
	statuses := []int{503, 429, 409, 500, 201}
	log, url, c := serveAttempts(t, httpidem.TransportConfig{MaxAttempts: len(statuses)}, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(statuses[n-1])
	})
	rp, err := httpidem.PostJSON(context.Background(), c, url, map[string]int{"n": 1}, nil)
	if err != nil || rp.Status != 201 {
		t.Fatalf("PostJSON = %+v, %v; want 201", rp, err)
	}
	log.check(t, len(statuses), true)
}

func TestClientNeverRetriesOtherClientErrors(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 401, 404, 412, 422} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			log, url, c := serveAttempts(t, httpidem.TransportConfig{}, func(_ int, w http.ResponseWriter, r *http.Request) {
				http.Error(w, "no", status)
			})
			_, err := httpidem.PostJSON(context.Background(), c, url, cart, nil)
			var se *httpidem.StatusError
			if !errors.As(err, &se) || se.Status != status {
				t.Fatalf("PostJSON error = %v, want a StatusError %d", err, status)
			}
			log.check(t, 1, true)
		})
	}
}

func TestClientDoesNotRetryReplayedAnswer(t *testing.T) {
	t.Parallel()
	log, url, c := serveAttempts(t, httpidem.TransportConfig{}, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusInternalServerError)
	})
	rp, err := httpidem.PostJSON(context.Background(), c, url, cart, nil)
	if err == nil || rp == nil || rp.Status != 500 || !rp.Replayed {
		t.Fatalf("PostJSON = %+v, %v; want the replayed 500", rp, err)
	}
	log.check(t, 1, true)
}

func TestClientHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	log, url, c := serveAttempts(t, httpidem.TransportConfig{}, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	start := time.Now()
	rp, err := httpidem.PostJSON(context.Background(), c, url, cart, nil)
	if err != nil || rp.Status != 201 {
		t.Fatalf("PostJSON = %+v, %v", rp, err)
	}
	if elapsed := time.Since(start); elapsed < time.Second {
		t.Fatalf("retried after %v, want at least the Retry-After of 1s", elapsed)
	}
	log.check(t, 2, true)
}

func TestClientReturnsAnswerWhenRetryAfterIsTooLong(t *testing.T) {
	t.Parallel()
	log, url, c := serveAttempts(t, httpidem.TransportConfig{MaxRetryAfter: time.Minute}, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	start := time.Now()
	rp, err := httpidem.PostJSON(context.Background(), c, url, cart, nil)
	if rp == nil || rp.Status != 503 || err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("PostJSON = %+v, %v after %v; want the 503 at once", rp, err, time.Since(start))
	}
	log.check(t, 1, true)
}

func TestClientGivesUpWithLastError(t *testing.T) {
	t.Parallel()
	log, url, c := serveAttempts(t, httpidem.TransportConfig{MaxAttempts: 3}, func(_ int, w http.ResponseWriter, r *http.Request) {
		hangUp(t, w)
	})
	_, err := httpidem.PostJSON(context.Background(), c, url, cart, nil)
	var gu *httpidem.GiveUpError
	if !errors.Is(err, httpidem.ErrGaveUp) || !errors.As(err, &gu) || gu.Attempts != 3 || gu.Err == nil {
		t.Fatalf("error = %v, want a GiveUpError after 3 attempts", err)
	}
	log.check(t, 3, true)
	if gu.Key != log.keys[0] {
		t.Fatalf("GiveUpError key %q, sent %q", gu.Key, log.keys[0])
	}
}

func TestClientGivesUpOnPersistentStatus(t *testing.T) {
	t.Parallel()
	log, url, c := serveAttempts(t, httpidem.TransportConfig{MaxAttempts: 4}, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	})
	rp, err := httpidem.PostJSON(context.Background(), c, url, cart, nil)
	var se *httpidem.StatusError
	if !errors.As(err, &se) || se.Status != 502 || rp.Status != 502 {
		t.Fatalf("PostJSON = %+v, %v; want the last 502", rp, err)
	}
	log.check(t, 4, true)
}

func TestClientRetriesAttemptTimeout(t *testing.T) {
	t.Parallel()
	log, url, c := serveAttempts(t, httpidem.TransportConfig{AttemptTimeout: 200 * time.Millisecond}, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			select { // hang until the client times the attempt out
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	rp, err := httpidem.PostJSON(context.Background(), c, url, cart, nil)
	if err != nil || rp.Status != 201 {
		t.Fatalf("PostJSON = %+v, %v; want 201 from the second attempt", rp, err)
	}
	log.check(t, 2, true)
}

func TestClientIdempotentMethodsRetryWithoutKey(t *testing.T) {
	t.Parallel()
	log, url, c := serveAttempts(t, httpidem.TransportConfig{}, func(n int, w http.ResponseWriter, r *http.Request) {
		if n < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	req, _ := http.NewRequest(http.MethodPut, url, strings.NewReader(`{"a":1}`))
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("PUT = %v, %v", resp, err)
	}
	resp.Body.Close()
	log.check(t, 3, false)
}

func TestClientStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	log, url, c := serveAttempts(t, httpidem.TransportConfig{}, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := httpidem.PostJSON(ctx, c, url, cart, nil)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("error = %v after %v, want the context's deadline promptly", err, time.Since(start))
	}
	log.check(t, 1, true)
}

func TestNewKeyIsUUIDv4(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		k := httpidem.NewKey()
		if !re.MatchString(k) || seen[k] {
			t.Fatalf("key %q is not a fresh UUIDv4", k)
		}
		seen[k] = true
	}
}

func TestTransportConfigValidation(t *testing.T) {
	t.Parallel()
	for _, cfg := range []httpidem.TransportConfig{
		{MaxAttempts: -1},
		{InitialBackoff: time.Second, MaxBackoff: time.Millisecond},
		{RequestIDHeader: "idempotency-key"},
	} {
		if _, err := httpidem.NewTransport(cfg); !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("NewTransport(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestClientRetriesInFlightUntilReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	served := make(chan int, 16)
	log, url, c := serveAttempts(t, httpidem.TransportConfig{MaxAttempts: 10}, func(_ int, w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		b.handler.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		served <- rec.Code
	})
	held := cart
	held.Block = true
	var first reply
	done := make(chan struct{})
	go func() { defer close(done); first = b.post(t, "acme", "key-held", held) }()
	select {
	case <-b.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request did not start")
	}
	type result struct {
		rp  *httpidem.Reply
		id  int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		var out struct{ ID int64 }
		rp, err := httpidem.PostJSON(context.Background(), c, url+"/orders", held, &out,
			httpidem.WithHeader("X-Tenant-ID", "acme"), httpidem.WithKey("key-held"))
		got <- result{rp, out.ID, err}
	}()
	select {
	case status := <-served:
		if status != http.StatusConflict {
			t.Fatalf("the client's first attempt got %d while the key was held, want 409", status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client never reached the server")
	}
	close(b.unblock) // the holder finishes; the client's next attempt is replayed
	<-done
	r := <-got
	if r.err != nil || r.rp.Status != http.StatusCreated || !r.rp.Replayed || r.id != first.id {
		t.Fatalf("client got %+v id=%d, %v; want the replayed 201 of order %d", r.rp, r.id, r.err, first.id)
	}
	log.mu.Lock()
	n := log.attempts
	log.mu.Unlock()
	if n < 2 {
		t.Fatalf("client made %d attempts, want a 409 then the replay", n)
	}
	log.check(t, n, true)
	if got := b.orders(t, "acme"); got != 1 {
		t.Fatalf("orders = %d, want 1", got)
	}
}
