package httpidem_test

import (
	"net/http"
	"testing"

	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestEveryConnectionGoesBackToThePool: over a pgx pool, the transactional
// mode holds the request's connection itself (the stored response and
// COMMIT go in one round trip, and the connection goes back to the pool
// without a pgx.Tx's own COMMIT). However a request ends — stored, replayed,
// refused, a 500 stored or rolled back, a panic, an oversize response, a
// transaction the handler committed itself, a killed connection, a
// concurrent duplicate refused after the lock timeout — no connection stays
// acquired once it has answered (a broken connection is destroyed by the
// pool in a goroutine of its own, so the count is read once it settles).
func TestEveryConnectionGoesBackToThePool(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode httpidem.Mode) {
		b := setup(t, httpidem.Config{Mode: mode, MaxResponseBytes: 4096})
		with := func(f func(o *order)) order { o := cart; f(&o); return o }
		steps := []struct {
			name, key string
			in        order
			want      int
		}{
			{"new", "k-new", cart, http.StatusCreated},
			{"replay", "k-new", cart, http.StatusCreated},
			{"key reused", "k-new", with(func(o *order) { o.TotalCents++ }), http.StatusUnprocessableEntity},
			{"handler answers 500", "k-fail", with(func(o *order) { o.Fail = true }), http.StatusInternalServerError},
			{"500 replayed", "k-fail", with(func(o *order) { o.Fail = true }), http.StatusInternalServerError},
			{"handler panics", "k-panic", with(func(o *order) { o.Panic = true }), http.StatusInternalServerError},
			{"oversize response", "k-big", with(func(o *order) { o.Big = 8192 }), http.StatusInternalServerError},
			{"handler commits itself", "k-commit", with(func(o *order) { o.EndTx = "COMMIT" }), http.StatusInternalServerError},
			{"connection killed", "k-kill", with(func(o *order) { o.Kill = true }), http.StatusServiceUnavailable},
		}
		for _, s := range steps {
			r := b.post(t, "acme", s.key, s.in)
			if r.status != s.want {
				t.Errorf("%s: answer %d %s, want %d", s.name, r.status, r.body, s.want)
			}
			if n := dbtest.SettledAcquired(b.db.Pool); n != 0 {
				t.Fatalf("%s: %d connections still acquired after the answer", s.name, n)
			}
		}
		// Duplicates at the same instant: one executes, the others wait for
		// it (the lock timeout) or are refused while it holds the key.
		const n = 5
		replies := make([]reply, n)
		together(n, func(i int) { replies[i] = b.post(t, "acme", "k-together", cart) })
		if fresh, _, _ := countReplies(t, replies, http.StatusCreated); fresh != 1 {
			t.Errorf("fresh answers to duplicates = %d, want 1", fresh)
		}
		if n := dbtest.SettledAcquired(b.db.Pool); n != 0 {
			t.Fatalf("%d connections still acquired after concurrent duplicates", n)
		}
	})
}
