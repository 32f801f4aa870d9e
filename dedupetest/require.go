package dedupetest

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/exactlyonce/dedupe"
)

// KeyWant is what RequireKey checks of a key's record. A zero field is not
// checked.
type KeyWant struct {
	// State is the key's state: dedupe.StateInFlight, StateComplete or
	// StateFailed.
	State dedupe.State
	// Attempts is how many attempts claimed the key (the first claim is 1;
	// each takeover and each retry after a failure adds one).
	Attempts int
	// Result, when set, must equal the stored result: its Status, its Body
	// byte for byte, and its Headers (a nil and an empty map are equal).
	Result *dedupe.Result
	// LastError, when set, must appear in the key's last recorded error.
	LastError string
}

// RequireKey fails the test unless key is stored with what want names, and
// returns its record; with an absent key it fails. It is the inbox-side
// check that complements counting effects: a handled message is complete
// with one attempt, a poisoned one failed with the error that poisoned it,
// a replayed request's stored response is the one the first answer sent.
func (e *Env) RequireKey(t testing.TB, key dedupe.Key, want KeyWant) *dedupe.Record {
	t.Helper()
	rec := e.lookup(t, key)
	if rec == nil {
		t.Fatalf("dedupetest: key %s is absent, want %s", key, want)
		return nil
	}
	var diffs []string
	if want.State != "" && rec.State != want.State {
		diffs = append(diffs, fmt.Sprintf("state %s, want %s", rec.State, want.State))
	}
	if want.Attempts != 0 && rec.Attempts != want.Attempts {
		diffs = append(diffs, fmt.Sprintf("attempts %d, want %d", rec.Attempts, want.Attempts))
	}
	if want.Result != nil {
		switch {
		case rec.Result == nil:
			diffs = append(diffs, fmt.Sprintf("no stored result, want %s", resultString(want.Result)))
		case !sameResult(rec.Result, want.Result):
			diffs = append(diffs, fmt.Sprintf("result %s, want %s", resultString(rec.Result), resultString(want.Result)))
		}
	}
	if want.LastError != "" && !strings.Contains(rec.LastError, want.LastError) {
		diffs = append(diffs, fmt.Sprintf("last error %q, want one containing %q", rec.LastError, want.LastError))
	}
	if len(diffs) > 0 {
		t.Fatalf("dedupetest: key %s: %s", key, strings.Join(diffs, "; "))
	}
	return rec
}

// RequireState fails the test unless key is stored in state, and returns its
// record.
func (e *Env) RequireState(t testing.TB, key dedupe.Key, state dedupe.State) *dedupe.Record {
	t.Helper()
	return e.RequireKey(t, key, KeyWant{State: state})
}

// RequireAttempts fails the test unless key is stored after exactly n
// attempts, and returns its record.
func (e *Env) RequireAttempts(t testing.TB, key dedupe.Key, n int) *dedupe.Record {
	t.Helper()
	if n == 0 {
		t.Fatalf("dedupetest: RequireAttempts(%s, 0): a stored key has at least one attempt; use RequireAbsent", key)
	}
	return e.RequireKey(t, key, KeyWant{Attempts: n})
}

// RequireResult fails the test unless key is stored with result (see
// KeyWant.Result), and returns its record.
func (e *Env) RequireResult(t testing.TB, key dedupe.Key, result dedupe.Result) *dedupe.Record {
	t.Helper()
	return e.RequireKey(t, key, KeyWant{Result: &result})
}

// RequireAbsent fails the test unless key is absent from the inbox: no
// attempt claimed it, or every claim rolled back.
func (e *Env) RequireAbsent(t testing.TB, key dedupe.Key) {
	t.Helper()
	if rec := e.lookup(t, key); rec != nil {
		t.Fatalf("dedupetest: key %s is stored (state %s, attempts %d), want it absent", key, rec.State, rec.Attempts)
	}
}

// lookup returns key's record, nil when it is absent.
func (e *Env) lookup(t testing.TB, key dedupe.Key) *dedupe.Record {
	t.Helper()
	ctx, cancel, _ := callContext(t)
	defer cancel()
	rec, err := e.Inbox.Lookup(ctx, key)
	switch {
	case errors.Is(err, dedupe.ErrNotFound):
		return nil
	case err != nil:
		t.Fatalf("dedupetest: look up %s: %v", key, err)
	}
	return rec
}

// String describes what is wanted, for failure messages.
func (w KeyWant) String() string {
	var parts []string
	if w.State != "" {
		parts = append(parts, "state "+string(w.State))
	}
	if w.Attempts != 0 {
		parts = append(parts, fmt.Sprintf("attempts %d", w.Attempts))
	}
	if w.Result != nil {
		parts = append(parts, "result "+resultString(w.Result))
	}
	if w.LastError != "" {
		parts = append(parts, fmt.Sprintf("last error containing %q", w.LastError))
	}
	if len(parts) == 0 {
		return "it stored"
	}
	return strings.Join(parts, ", ")
}

func sameResult(a, b *dedupe.Result) bool {
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) &&
		maps.EqualFunc(a.Headers, b.Headers, func(x, y []string) bool { return slices.Equal(x, y) })
}

func resultString(r *dedupe.Result) string {
	return fmt.Sprintf("{status %d, headers %v, body %q}", r.Status, r.Headers, r.Body)
}
