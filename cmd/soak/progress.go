package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// errNoProgress ends a run that made no progress for -idle.
var errNoProgress = errors.New("soak: no progress")

// progress measures how far one transport's run has come: the effects it
// committed (read from the database, so the worker subprocesses count too)
// plus the deliveries acknowledged in this process. Faults are paced by it
// ("terminate a connection every N effects"), so a slow machine suffers as
// many faults per message as a fast one, and a run gives up only when it
// stops moving for -idle, never after a fixed total.
type progress struct {
	admin     *pgxpool.Pool
	transport string
	acks      atomic.Int64 // acknowledged deliveries, counted by the broker

	mu      sync.Mutex
	effects int64
	changed chan struct{} // closed and replaced whenever effects grows
	last    time.Time     // when the progress value last changed
	value   int64         // effects + acks at last
}

func newProgress(admin *pgxpool.Pool, transport string) *progress {
	return &progress{admin: admin, transport: transport, changed: make(chan struct{}), last: time.Now()}
}

// pollEvery is how often progress reads the effect count.
const pollEvery = 10 * time.Millisecond

// watch polls the effect count until ctx ends, and calls stall when the run
// made no progress for idle (0: never). It returns when ctx ends or after
// stall.
func (p *progress) watch(ctx context.Context, idle time.Duration, stall func()) {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var n int64
		if err := p.admin.QueryRow(ctx, sqlEffectTotal, p.transport).Scan(&n); err != nil {
			continue // the next poll tries again; a dead database is a stall
		}
		now := time.Now()
		p.mu.Lock()
		if n > p.effects {
			p.effects = n
			close(p.changed)
			p.changed = make(chan struct{})
		}
		if v := p.effects + p.acks.Load(); v != p.value {
			p.value, p.last = v, now
		}
		stalled := idle > 0 && now.Sub(p.last) > idle
		p.mu.Unlock()
		if stalled {
			stall()
			return
		}
	}
}

// effectsNow returns the effect count as last read.
func (p *progress) effectsNow() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.effects
}

// waitEffects blocks until at least n effects committed, and reports false
// when ctx ended first.
func (p *progress) waitEffects(ctx context.Context, n int64) bool {
	for {
		p.mu.Lock()
		got, changed := p.effects, p.changed
		p.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}

// stallError describes a run that stopped moving.
func (p *progress) stallError(idle time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Errorf("%w for %s (effects %d, acknowledged deliveries %d)", errNoProgress, idle, p.effects, p.acks.Load())
}

// every calls fire each time the effect count grows by n, paced by
// progress, until the returned stop is called; stop waits for it to return.
// fire reports whether the fault fired; each time it did, the run counts kind.
func (e *env) every(ctx context.Context, n int64, kind faultKind, fire func(ctx context.Context) bool) (stop func()) {
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for next := e.progress.effectsNow() + n; ; next += n {
			if !e.progress.waitEffects(cctx, next) {
				return
			}
			if fire(cctx) {
				e.faults.add(kind)
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}
