// Package observetest is a dedupe.Observer for tests and the repository's
// programs (the soak, the benchmarks; the example programs, which import
// only public packages, use examples/counter): it counts handlings by
// mode and outcome and transport events by name, and waits for a count,
// paced by the progress it observes. Set it as the inbox's Config.Observer
// (with dedupe.Observers next to another one). It does not import testing.
package observetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/dedupe"
)

// Modes of dedupe.HandleInfo, as counted.
var modes = [...]string{"transactional", "batch", "leased", "other"}

// outcomes bounds the dedupe.Outcome values counted one by one; any other
// is counted as 0 (no outcome).
const outcomes = int(dedupe.OutcomeUnknown) + 1

// Observer counts what it is told; it is safe for concurrent use and cheap
// enough for benchmarks (atomic counters, no lock per message). Build it
// with New.
type Observer struct {
	dedupe.NopObserver
	started      [len(modes)]atomic.Int64
	ended        [len(modes)][outcomes]atomic.Int64
	notAttempted atomic.Int64
	claimedNanos atomic.Int64
	events       sync.Map // name → *eventCount

	// progress counts the reports that are progress (see Wait); signal
	// wakes a Wait after each.
	progress atomic.Int64
	signal   chan struct{}
}

type eventCount struct{ n, covered atomic.Int64 }

var _ dedupe.Observer = (*Observer)(nil)

// New returns an Observer with every count at zero.
func New() *Observer { return &Observer{signal: make(chan struct{}, 1)} }

func modeIndex(mode string) int {
	for i, m := range modes[:len(modes)-1] {
		if m == mode {
			return i
		}
	}
	return len(modes) - 1
}

func outcomeIndex(o dedupe.Outcome) int {
	if o > 0 && int(o) < outcomes {
		return int(o)
	}
	return 0
}

// StartHandle counts a handling that starts and, when it ends, its outcome.
func (o *Observer) StartHandle(ctx context.Context, h dedupe.HandleInfo) (context.Context, func(dedupe.HandleDone)) {
	m := modeIndex(h.Mode)
	o.started[m].Add(1)
	return ctx, func(d dedupe.HandleDone) {
		o.ended[m][outcomeIndex(d.Outcome)].Add(1)
		if errors.Is(d.Err, dedupe.ErrNotAttempted) {
			o.notAttempted.Add(1)
		}
		switch d.Outcome {
		case dedupe.OutcomeClaimed:
			o.claimedNanos.Add(int64(d.Duration))
			o.progressed()
		case dedupe.OutcomeDuplicate, dedupe.OutcomePoisoned, dedupe.OutcomeConflict:
			o.progressed()
		}
	}
}

// TransportEvent counts e under its name, and its Count (at least 1).
func (o *Observer) TransportEvent(_ context.Context, e dedupe.TransportEvent) {
	c, ok := o.events.Load(e.Name)
	if !ok {
		c, _ = o.events.LoadOrStore(e.Name, &eventCount{})
	}
	ec := c.(*eventCount)
	ec.n.Add(1)
	ec.covered.Add(int64(max(e.Count, 1)))
	switch e.Name {
	case dedupe.EventRetried, dedupe.EventDeadLetterFailed, dedupe.EventOffsetCommitFailed,
		dedupe.EventRefused, dedupe.EventAckFailed, dedupe.EventReleased:
		// Repeated while something fails, or on every redelivery of a
		// message that never settles: not progress.
	default:
		o.progressed()
	}
}

func (o *Observer) progressed() {
	o.progress.Add(1)
	select {
	case o.signal <- struct{}{}:
	default:
	}
}

// Started returns how many handlings started in mode ("transactional",
// "batch", "leased"; "" for every mode).
func (o *Observer) Started(mode string) int64 {
	if mode == "" {
		var n int64
		for i := range o.started {
			n += o.started[i].Load()
		}
		return n
	}
	return o.started[modeIndex(mode)].Load()
}

// Handled returns how many handlings, in any mode, ended with outcome; 0
// counts those that ended with an error and no outcome (the database
// failed, the context ended).
func (o *Observer) Handled(outcome dedupe.Outcome) int64 {
	var n int64
	for m := range modes {
		n += o.ended[m][outcomeIndex(outcome)].Load()
	}
	return n
}

// HandledIn is Handled for the handlings of one mode.
func (o *Observer) HandledIn(mode string, outcome dedupe.Outcome) int64 {
	return o.ended[modeIndex(mode)][outcomeIndex(outcome)].Load()
}

// Ended returns how many handlings ended, whatever they came to.
func (o *Observer) Ended() int64 {
	var n int64
	for m := range modes {
		for k := range outcomes {
			n += o.ended[m][k].Load()
		}
	}
	return n
}

// NotAttempted returns how many batch handlings ended unattempted
// (dedupe.ErrNotAttempted: after a message that failed), which Handled
// also counts under dedupe.OutcomeRetry.
func (o *Observer) NotAttempted() int64 { return o.notAttempted.Load() }

// ClaimedTime returns the summed duration of the handlings that ended
// claimed (claim, handler and commit).
func (o *Observer) ClaimedTime() time.Duration { return time.Duration(o.claimedNanos.Load()) }

// Events returns how many transport events named name were reported.
func (o *Observer) Events(name string) int64 {
	if c, ok := o.events.Load(name); ok {
		return c.(*eventCount).n.Load()
	}
	return 0
}

// Covered returns the sum of the Count of the events named name (each
// counted at least 1): the messages of dedupe.EventBatchHandled, the
// partitions of dedupe.EventOffsetsCommitted.
func (o *Observer) Covered(name string) int64 {
	if c, ok := o.events.Load(name); ok {
		return c.(*eventCount).covered.Load()
	}
	return 0
}

// String lists the nonzero counts, for logs and failure messages.
func (o *Observer) String() string {
	var parts []string
	for m, mode := range modes {
		if n := o.started[m].Load(); n > 0 {
			parts = append(parts, fmt.Sprintf("%s started=%d", mode, n))
		}
		for k := range outcomes {
			if n := o.ended[m][k].Load(); n > 0 {
				name := dedupe.Outcome(k).String()
				if k == 0 {
					name = "error"
				}
				parts = append(parts, fmt.Sprintf("%s %s=%d", mode, name, n))
			}
		}
	}
	if n := o.notAttempted.Load(); n > 0 {
		parts = append(parts, fmt.Sprintf("not_attempted=%d", n))
	}
	var events []string
	o.events.Range(func(k, v any) bool {
		c := v.(*eventCount)
		s := fmt.Sprintf("%s=%d", k, c.n.Load())
		if cov := c.covered.Load(); cov != c.n.Load() {
			s += fmt.Sprintf("(covering %d)", cov)
		}
		events = append(events, s)
		return true
	})
	slices.Sort(events)
	return strings.Join(append(parts, events...), " ")
}

// Wait waits until cond holds, checking it after each report that is
// progress and every 10ms (cond may look beyond the Observer, at a broker
// say). It fails t when stall passes without progress: a handling that
// ended claimed, duplicate, poisoned or conflict, or a transport event
// other than the ones repeated while something keeps failing (retried,
// dead_letter_failed, offset_commit_failed). So a slow machine gets all
// the time it needs, and a test stuck in retries fails.
func (o *Observer) Wait(t TB, stall time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	seen := o.progress.Load()
	deadline := time.Now().Add(stall)
	for !cond() {
		if p := o.progress.Load(); p != seen {
			seen, deadline = p, time.Now().Add(stall)
		} else if time.Now().After(deadline) {
			t.Fatalf("no progress for %v waiting for %s; observed: %s", stall, what, o)
		}
		select {
		case <-o.signal:
		case <-tick.C:
		}
	}
}

// TB is the part of testing.TB that Wait uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// OnEvent returns an Observer that calls f for each transport event and
// does nothing else; use it with dedupe.Observers next to a counting one.
func OnEvent(f func(context.Context, dedupe.TransportEvent)) dedupe.Observer { return eventFunc{f: f} }

type eventFunc struct {
	dedupe.NopObserver
	f func(context.Context, dedupe.TransportEvent)
}

func (e eventFunc) TransportEvent(ctx context.Context, ev dedupe.TransportEvent) { e.f(ctx, ev) }

// OnHandled returns an Observer that calls f when a handling ends, with
// what it started with, and does nothing else.
func OnHandled(f func(dedupe.HandleInfo, dedupe.HandleDone)) dedupe.Observer {
	return handledFunc{f: f}
}

type handledFunc struct {
	dedupe.NopObserver
	f func(dedupe.HandleInfo, dedupe.HandleDone)
}

func (h handledFunc) StartHandle(ctx context.Context, i dedupe.HandleInfo) (context.Context, func(dedupe.HandleDone)) {
	return ctx, func(d dedupe.HandleDone) { h.f(i, d) }
}
