package counter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/exactlyonce/dedupe"
)

// Observer counts what it is told; it is safe for concurrent use. Build it
// with New and set it as the inbox's Config.Observer.
type Observer struct {
	dedupe.NopObserver
	ended  sync.Map // dedupe.Outcome → *atomic.Int64
	events sync.Map // event name → *atomic.Int64
}

var _ dedupe.Observer = (*Observer)(nil)

// New returns an Observer with every count at zero.
func New() *Observer { return &Observer{} }

// StartHandle counts the outcome of the handling when it ends.
func (o *Observer) StartHandle(ctx context.Context, _ dedupe.HandleInfo) (context.Context, func(dedupe.HandleDone)) {
	return ctx, func(d dedupe.HandleDone) { add(&o.ended, d.Outcome) }
}

// TransportEvent counts e under its name.
func (o *Observer) TransportEvent(_ context.Context, e dedupe.TransportEvent) { add(&o.events, e.Name) }

// Handled returns how many handlings ended with outcome (0: with an error
// and no outcome).
func (o *Observer) Handled(outcome dedupe.Outcome) int64 { return load(&o.ended, outcome) }

// Ended returns how many handlings ended, whatever they came to.
func (o *Observer) Ended() int64 {
	var n int64
	o.ended.Range(func(_, c any) bool { n += c.(*atomic.Int64).Load(); return true })
	return n
}

// Events returns how many transport events named name were reported.
func (o *Observer) Events(name string) int64 { return load(&o.events, name) }

// String lists the nonzero counts, for logs: "claimed=3 duplicate=1
// retried=2".
func (o *Observer) String() string {
	var parts []string
	o.ended.Range(func(k, c any) bool {
		name := k.(dedupe.Outcome).String()
		if k.(dedupe.Outcome) == 0 {
			name = "error"
		}
		parts = append(parts, fmt.Sprintf("%s=%d", name, c.(*atomic.Int64).Load()))
		return true
	})
	o.events.Range(func(k, c any) bool {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

func add[K comparable](m *sync.Map, k K) {
	c, ok := m.Load(k)
	if !ok {
		c, _ = m.LoadOrStore(k, new(atomic.Int64))
	}
	c.(*atomic.Int64).Add(1)
}

func load[K comparable](m *sync.Map, k K) int64 {
	if c, ok := m.Load(k); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}
