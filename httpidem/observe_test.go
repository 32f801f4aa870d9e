package httpidem_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// countingObserver counts handlings by outcome and keeps what the first
// handling was told of its request.
type countingObserver struct {
	dedupe.NopObserver
	mu       sync.Mutex
	started  int
	ended    int
	outcomes map[dedupe.Outcome]int
	errs     int
	first    dedupe.HandleInfo
}

func (o *countingObserver) StartHandle(ctx context.Context, h dedupe.HandleInfo) (context.Context, func(dedupe.HandleDone)) {
	o.mu.Lock()
	if o.started == 0 {
		o.first = h
	}
	o.started++
	o.mu.Unlock()
	return ctx, func(d dedupe.HandleDone) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.ended++
		o.outcomes[d.Outcome]++
		if d.Err != nil && (d.Outcome == dedupe.OutcomeClaimed || d.Outcome == dedupe.OutcomeRetry) {
			o.errs++
		}
	}
}

// snapshot returns the counts; it fails t unless every handling started
// ended exactly once.
func (o *countingObserver) snapshot(t *testing.T) (started int, outcomes map[dedupe.Outcome]int, errs int, first dedupe.HandleInfo) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended != o.started {
		t.Errorf("handlings started = %d, ended = %d: each must end exactly once", o.started, o.ended)
	}
	out := make(map[dedupe.Outcome]int, len(o.outcomes))
	for k, v := range o.outcomes {
		out[k] = v
	}
	return o.started, out, o.errs, o.first
}

// TestObserverSeesEveryRequestOnce: concurrent retries of one request, in
// both modes, are each reported to the inbox's Observer once, with the
// outcome the client saw: one claimed (the order created), a duplicate per
// replayed answer, in_flight per 409; a failing request whose 500 is stored
// as its answer is claimed without error, as Complete reports it. Each
// handling carries the request's MessageInfo.
func TestObserverSeesEveryRequestOnce(t *testing.T) {
	forModes(t, func(t *testing.T, mode httpidem.Mode) {
		obs := &countingObserver{outcomes: map[dedupe.Outcome]int{}}
		b := setup(t, httpidem.Config{Mode: mode, Inbox: dedupe.Config{Observer: obs}})
		const n = 8
		replies := make([]reply, n)
		together(n, func(i int) { replies[i] = b.post(t, "acme", "obs-1", order{CartID: "c1", TotalCents: 100}) })
		replies = append(replies, b.post(t, "acme", "obs-1", order{CartID: "c1", TotalCents: 100}))
		replayed, conflicts := 0, 0
		for _, r := range replies {
			switch {
			case r.status == http.StatusCreated && r.replayed:
				replayed++
			case r.status == http.StatusConflict:
				conflicts++
			case r.status != http.StatusCreated:
				t.Fatalf("reply %d: %s", r.status, r.body)
			}
		}
		if got := b.post(t, "acme", "obs-fail", order{CartID: "c2", TotalCents: 1, Fail: true}); got.status != http.StatusInternalServerError {
			t.Fatalf("failing request: %d %s", got.status, got.body)
		}

		started, outcomes, errs, first := obs.snapshot(t)
		if started != n+2 {
			t.Errorf("handlings started = %d, want %d (one per request with a key)", started, n+2)
		}
		if got, orders := outcomes[dedupe.OutcomeClaimed], b.orders(t, "acme"); got != 2 || orders != 1 {
			t.Errorf("claimed = %d, want 2 (the order and the failing request); orders = %d, want 1", got, orders)
		}
		if got := outcomes[dedupe.OutcomeDuplicate]; got != replayed {
			t.Errorf("duplicates = %d, replays answered = %d", got, replayed)
		}
		if got := outcomes[dedupe.OutcomeInFlight]; got != conflicts {
			t.Errorf("in_flight = %d, 409s answered = %d", got, conflicts)
		}
		if errs != 0 {
			t.Errorf("handlings with an error = %d, want 0 (the 500 is stored)", errs)
		}
		m := first.Message
		if m.System != "http" || m.Destination == "" || m.Headers == nil || m.Headers.Get("Idempotency-Key") == "" {
			t.Errorf("message info = %+v, want the request's", m)
		}
	})
}

// TestObserverSeesReleasedKeysAsRetries: under RetryServerErrors a failing
// request's key is released for the retry: the handling is reported as
// OutcomeRetry with its error, in both modes.
func TestObserverSeesReleasedKeysAsRetries(t *testing.T) {
	forModes(t, func(t *testing.T, mode httpidem.Mode) {
		obs := &countingObserver{outcomes: map[dedupe.Outcome]int{}}
		b := setup(t, httpidem.Config{Mode: mode, ServerErrors: httpidem.RetryServerErrors, Inbox: dedupe.Config{Observer: obs}})
		if got := b.post(t, "acme", "obs-retry", order{CartID: "c3", TotalCents: 1, Fail: true}); got.status != http.StatusInternalServerError {
			t.Fatalf("failing request: %d %s", got.status, got.body)
		}
		_, outcomes, errs, _ := obs.snapshot(t)
		if outcomes[dedupe.OutcomeRetry] != 1 || errs != 1 || len(outcomes) != 1 {
			t.Errorf("outcomes = %v (with an error: %d), want one retry with its error", outcomes, errs)
		}
		if st, err := b.mw.Inbox().Lookup(context.Background(), dedupe.Key{Scope: "acme", ID: "obs-retry"}); err == nil && st.State == dedupe.StateComplete {
			t.Errorf("the released key is %v, want it free for the retry", st.State)
		}
	})
}
