package httpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/httpidem"
)

// TestIdemLateResponseIsNotStored: the client hangs up mid-request and the
// handler, seeing its context end, answers a 4xx (408, or nginx's 499).
// That answer is an artefact of the cancellation, not the operation's: it
// is not stored, the handler's work is rolled back and the key released, so
// the retries (fired at once) execute the operation exactly once. Before,
// the 408/499 was stored and replayed for 24 h (and the order committed).
func TestIdemLateResponseIsNotStored(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusRequestTimeout, 499} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			forModes(t, func(t *testing.T, mode httpidem.Mode) {
				b := setup(t, httpidem.Config{Mode: mode})
				late := cart
				late.Late = status
				payload, _ := json.Marshal(late)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", bytes.NewReader(payload))
				req.Header.Set("X-Tenant-ID", "acme")
				req.Header.Set("Idempotency-Key", "key-late")
				w := httptest.NewRecorder()
				done := make(chan struct{})
				go func() { defer close(done); b.handler.ServeHTTP(w, req) }()
				select {
				case <-b.blocked:
				case <-time.After(30 * time.Second):
					t.Fatal("the handler did not start")
				}
				cancel() // the client hangs up
				<-done
				if got := b.orders(t, "acme"); got != 0 {
					t.Fatalf("orders = %d after the cancelled request, want 0 (rolled back)", got)
				}
				const n = 4
				replies := make([]reply, n)
				together(n, func(i int) { replies[i] = b.post(t, "acme", "key-late", late) })
				fresh, _, _ := countReplies(t, replies, http.StatusCreated)
				if fresh != 1 || b.orders(t, "acme") != 1 || b.calls.Load() != 2 {
					t.Fatalf("retries: %d fresh 201s, orders %d, handler calls %d; want the retry executed once (1, 1, 2)",
						fresh, b.orders(t, "acme"), b.calls.Load())
				}
			})
		})
	}
}
