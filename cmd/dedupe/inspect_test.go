package main

import (
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
)

// TestRecordLease classifies the lease of an in-flight key on the
// database's clock: live, released by a failed attempt (its end and the
// row's last write are two clock readings of one statement, either order),
// or expired (it ended a lease after the last write).
func TestRecordLease(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { u := now.Add(d); return &u }
	for _, c := range []struct {
		name        string
		state       dedupe.State
		lockedUntil *time.Time
		updated     time.Time
		want        string
	}{
		{"live", dedupe.StateInFlight, at(10 * time.Second), now.Add(-20 * time.Second), "live"},
		{"released, end read first", dedupe.StateInFlight, at(-time.Minute), now.Add(-time.Minute + 3*time.Microsecond), "released"},
		{"released, end read last", dedupe.StateInFlight, at(-time.Minute + 3*time.Microsecond), now.Add(-time.Minute), "released"},
		{"expired", dedupe.StateInFlight, at(-time.Second), now.Add(-31 * time.Second), "expired"},
		{"complete", dedupe.StateComplete, nil, now, "none"},
		{"failed", dedupe.StateFailed, nil, now, "none"},
	} {
		r := &dedupe.Record{Key: dedupe.Key{Scope: "s", ID: "k"}, State: c.state, LockedUntil: c.lockedUntil, UpdatedAt: c.updated, ReadAt: now}
		if got := newRecordJSON(r).Lease; got != c.want {
			t.Errorf("%s: lease = %q, want %q", c.name, got, c.want)
		}
	}
}
