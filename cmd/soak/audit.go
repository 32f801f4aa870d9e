package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// report is the audit of one transport.
type report struct {
	transport  string
	inputs     int
	unique     int
	effects    int // effect rows of the transport
	missing    int // unique inputs without an effect
	duplicated int // inputs with more than one effect
	unknown    int // effects of ids that were never an input
	stuck      int // keys not complete after every input was acknowledged
	pastLease  int // of those, in flight with a lease that ran out
	faults     *faults
	elapsed    time.Duration
	runErr     error
}

// ok reports whether the audit found exactly one effect per unique input and
// nothing stuck.
func (r *report) ok() bool {
	return r.missing == 0 && r.duplicated == 0 && r.unknown == 0 && r.stuck == 0 &&
		r.effects == r.unique && r.runErr == nil
}

// String is the report line.
func (r *report) String() string {
	var faults int64
	detail := ""
	if r.faults != nil {
		faults, detail = r.faults.total(), " "+r.faults.String()
	}
	verdict := "ok"
	if !r.ok() {
		verdict = "MISMATCH"
	}
	return fmt.Sprintf("transport=%s inputs=%d unique=%d effects=%d missing=%d duplicated=%d faults=%d stuck=%d expired_leases=%d unknown=%d%s elapsed=%s result=%s",
		r.transport, r.inputs, r.unique, r.effects, r.missing, r.duplicated, faults, r.stuck, r.pastLease, r.unknown, detail,
		r.elapsed.Round(time.Millisecond), verdict)
}

// audit counts the effects of one transport against the inputs, and the keys
// of its scope left incomplete.
func (s *soak) audit(ctx context.Context, e *env) (*report, error) {
	r := &report{transport: e.name, inputs: len(s.inputs), unique: len(s.unique)}
	rows, err := s.admin.Query(ctx, sqlEffectCounts, e.name)
	if err != nil {
		return nil, err
	}
	var (
		id string
		n  int
	)
	seen := make(map[string]bool, len(s.unique))
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		r.effects += n
		seen[id] = true
		switch {
		case !s.unique[id]:
			r.unknown++
		case n > 1:
			r.duplicated++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for id := range s.unique {
		if !seen[id] {
			r.missing++
		}
	}
	if e.inboxless {
		return r, nil
	}
	if err := s.admin.QueryRow(ctx, sqlStuck, e.scope).Scan(&r.stuck); err != nil {
		return nil, err
	}
	if err := s.admin.QueryRow(ctx, sqlStuckPastLease, e.scope, time.Now()).Scan(&r.pastLease); err != nil {
		return nil, err
	}
	return r, nil
}

// effectsComplete reports whether every unique input has at least one
// effect, the condition for an external transport to be finished (the audit
// then checks for exactly one).
func (e *env) effectsComplete(ctx context.Context) (bool, error) {
	var n int
	if err := e.soak.admin.QueryRow(ctx, sqlDistinctEffects, e.name).Scan(&n); err != nil {
		return false, err
	}
	return n >= len(e.soak.unique), nil
}
