package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
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

// TestInspectListsByPrefix: the messages adapters refuse are recorded failed
// under a prefix; inspect --prefix lists them, with their reasons, and
// --state filters.
func TestInspectListsByPrefix(t *testing.T) {
	t.Parallel()
	e := setup(t)
	inbox, err := dedupe.New(e.db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"dedupenats-refused/ORDERS/7/1700000000000", "dedupenats-refused/ORDERS/3/1700000000000"} {
		if _, _, err := inbox.RecordFailure(ctx, dedupe.Key{Scope: "billing", ID: id}, dedupe.Permanent(errors.New("message has no usable key\nsecond line"))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := inbox.Begin(ctx, dedupe.Key{Scope: "billing", ID: "order-1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := inbox.RecordFailure(ctx, dedupe.Key{Scope: "other", ID: "dedupenats-refused/X/1/1"}, dedupe.Permanent(errors.New("x"))); err != nil {
		t.Fatal(err)
	}

	r := e.cli(t, "--json", "inspect", "--scope", "billing", "--prefix", "dedupenats-refused/")
	var list keyList
	if err := json.Unmarshal([]byte(r.stdout), &list); r.code != 0 || err != nil {
		t.Fatalf("inspect --prefix = %d (%v)\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if len(list.Keys) != 2 || list.Keys[0].Key != "dedupenats-refused/ORDERS/3/1700000000000" || list.Keys[0].State != dedupe.StateFailed ||
		!strings.Contains(list.Keys[0].LastError, "no usable key") || list.More {
		t.Fatalf("listed %+v", list)
	}
	r = e.cli(t, "inspect", "--scope", "billing", "--prefix", "dedupenats-refused/", "--limit", "1")
	if r.code != 0 || !strings.Contains(r.stdout, "dedupenats-refused/ORDERS/3/1700000000000  failed  1") ||
		!strings.Contains(r.stdout, "message has no usable key second line") || !strings.Contains(r.stdout, "raise --limit") ||
		strings.Contains(r.stdout, "ORDERS/7") {
		t.Fatalf("inspect --prefix --limit 1 = %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = e.cli(t, "--json", "inspect", "--scope", "billing", "--state", "in_flight")
	list = keyList{}
	if err := json.Unmarshal([]byte(r.stdout), &list); r.code != 0 || err != nil || len(list.Keys) != 1 || list.Keys[0].Key != "order-1" {
		t.Fatalf("inspect --state in_flight = %d %+v (%v)\n%s", r.code, list, err, r.stderr)
	}
	for _, args := range [][]string{
		{"--scope", "billing", "--prefix", "p", "--key", "k"},
		{"--prefix", "p"},
		{"--scope", "billing", "--state", "gone"},
		{"--scope", "billing", "--prefix", "p", "--limit", "0"},
	} {
		if r := e.cli(t, append([]string{"inspect"}, args...)...); r.code != exitUsage {
			t.Errorf("inspect %q = %d, want %d\n%s", args, r.code, exitUsage, r.stderr)
		}
	}
}
