package httpidem_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// TestIdemLostCommitReplyAnswersTheResponse: the proxy forwards the
// request's COMMIT, the server applies it, and the reply never reaches the
// middleware. A lost reply is not a rollback: the middleware learns on a
// fresh connection that the request committed and answers the handler's
// response, which is replayed afterwards; concurrent duplicates get 409 or
// the replay, and there is exactly one order. Before, the middleware
// answered 503 and logged that the work was rolled back. The same holds when
// the COMMIT's answer arrives and the backend then ends the connection with
// a FATAL error (terminated right after it answered): the server error
// reported for the COMMIT is no rollback either.
func TestIdemLostCommitReplyAnswersTheResponse(t *testing.T) {
	t.Parallel()
	for name, action := range map[string]pgproxy.Action{"reply lost": pgproxy.DropReply, "FATAL after the reply": pgproxy.FatalAfterReply} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lostCommitAnswersTheResponse(t, action)
		})
	}
}

func lostCommitAnswersTheResponse(t *testing.T, action pgproxy.Action) {
	forDriversModes(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
		b := setupOn(t, drv)
		_, p := b.viaProxy(t, pgproxy.Once(action, pgproxy.IsCommit), httpidem.Config{Mode: mode})
		const n = 6
		replies := make([]reply, n)
		together(n, func(i int) { replies[i] = b.post(t, "acme", "key-lost", cart) })
		if got := p.Stats().Of(action); got != 1 {
			t.Fatalf("the proxy faulted %d COMMITs, want 1", got)
		}
		fresh, replayed, inFlight := countReplies(t, replies, http.StatusCreated)
		if fresh != 1 {
			t.Fatalf("fresh 201 = %d (replayed %d, 409 %d); want the committed request answered with its 201", fresh, replayed, inFlight)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want exactly 1", got)
		}
		var first reply
		for _, r := range replies {
			if r.status == http.StatusCreated && !r.replayed {
				first = r
			}
		}
		again := b.post(t, "acme", "key-lost", cart)
		if again.status != http.StatusCreated || !again.replayed || again.id != first.id || string(again.body) != string(first.body) {
			t.Fatalf("replay = %d replayed=%v %s, want the replay of %s", again.status, again.replayed, again.body, first.body)
		}
		if got := b.calls.Load(); got != 1 {
			t.Fatalf("handler ran %d times, want 1", got)
		}
	})
}

// TestIdemCommitCutAnswersRetryable: the connection is cut before the
// COMMIT reaches the server, so nothing commits. The answer is a retryable
// 503 that never claims the outcome is unknown when it is not, there are no
// orders, and concurrent retries create exactly one.
func TestIdemCommitCutAnswersRetryable(t *testing.T) {
	t.Parallel()
	forDriversModes(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
		b := setupOn(t, drv)
		refusals := &refusalLog{}
		_, p := b.viaProxy(t, pgproxy.Once(pgproxy.Cut, pgproxy.IsCommit), httpidem.Config{Mode: mode, ErrorHandler: refusals.handle})
		first := b.post(t, "acme", "key-cut", cart)
		if p.Stats().Cuts != 1 {
			t.Fatalf("the proxy cut %d connections, want 1", p.Stats().Cuts)
		}
		if first.status != http.StatusServiceUnavailable || first.header.Get("Retry-After") == "" {
			t.Fatalf("answer with the COMMIT cut = %d %s (Retry-After %q), want a retryable 503", first.status, first.body,
				first.header.Get("Retry-After"))
		}
		if got := refusals.all(); len(got) != 1 || !errors.Is(got[0], httpidem.ErrStore) || errors.Is(got[0], httpidem.ErrOutcomeUnknown) {
			t.Fatalf("refusal = %v, want ErrStore (resolved: nothing committed)", got)
		}
		if got := b.orders(t, "acme"); got != 0 {
			t.Fatalf("orders = %d, want 0", got)
		}
		const n = 6
		replies := make([]reply, n)
		together(n, func(i int) { replies[i] = b.post(t, "acme", "key-cut", cart) })
		if fresh, _, _ := countReplies(t, replies, http.StatusCreated); fresh != 1 {
			t.Fatalf("fresh 201s among the retries = %d, want 1", fresh)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want exactly 1", got)
		}
	})
}

// TestIdemUnresolvedCommitIsOutcomeUnknown: the COMMIT reply is lost and
// the database cannot be reached to learn what happened (every later
// connection is cut). The answer is a retryable 503 matching
// ErrOutcomeUnknown, never a claim that the work was rolled back; once the
// database is back, the retry gets the committed request's response.
// Each subtest waits out the core's bound on resolving the COMMIT (10s)
// while the proxy cuts every connection: they wait at once
// (forDriversModesAtOnce).
func TestIdemUnresolvedCommitIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	forDriversModesAtOnce(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
		b := setupOn(t, drv)
		refusals := &refusalLog{}
		dropped := make(chan struct{})
		policy := func(ev pgproxy.Event) pgproxy.Action {
			select {
			case <-dropped:
				return pgproxy.Cut // the database is unreachable after the lost reply
			default:
			}
			if pgproxy.IsCommit(ev) {
				close(dropped)
				return pgproxy.DropReply
			}
			return pgproxy.Forward
		}
		_, p := b.viaProxy(t, policy, httpidem.Config{Mode: mode, ErrorHandler: refusals.handle})
		first := b.post(t, "acme", "key-unknown", cart)
		if first.status != http.StatusServiceUnavailable || first.header.Get("Retry-After") == "" {
			t.Fatalf("answer = %d %s, want a retryable 503", first.status, first.body)
		}
		if got := refusals.all(); len(got) != 1 || !errors.Is(got[0], httpidem.ErrOutcomeUnknown) ||
			!errors.Is(got[0], dedupe.ErrOutcomeUnknown) || errors.Is(got[0], httpidem.ErrStore) {
			t.Fatalf("refusal = %v, want ErrOutcomeUnknown", got)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want 1 (the COMMIT reached the server)", got)
		}
		p.SetPolicy(nil) // the database is reachable again
		again := b.post(t, "acme", "key-unknown", cart)
		if again.status != http.StatusCreated || !again.replayed {
			t.Fatalf("retry = %d replayed=%v %s, want the replayed 201", again.status, again.replayed, again.body)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want 1", got)
		}
	})
}
