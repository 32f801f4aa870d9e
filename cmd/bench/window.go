package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/dedupe"
)

// window measures a transport run: consumers (or relays) drain a backlog
// published beforehand and count each message they finish with add. The
// clock starts once the first message is done (so that start-up, such as a
// Kafka group join, is not measured) and the warm-up has passed; it then
// runs for its span's window, or until the backlog is gone. Counting
// happens in the process: no statement polls the database while the window
// is open.
type window struct {
	backlog     int64
	length      time.Duration
	done        atomic.Int64
	first, full chan struct{}
	firstOnce   sync.Once
	fullOnce    sync.Once
	failOnce    sync.Once
	failed      chan error
	lat         latencies
}

// span is what a transport side is given for one measured window: the
// backlog it drains and how long the window lasts.
type span struct {
	backlog int64
	window  time.Duration
}

func newWindow(sp span) *window {
	return &window{backlog: sp.backlog, length: sp.window, first: make(chan struct{}), full: make(chan struct{}), failed: make(chan error, 1)}
}

// add counts n finished messages.
func (w *window) add(n int64) {
	if n <= 0 {
		return
	}
	v := w.done.Add(n)
	w.firstOnce.Do(func() { close(w.first) })
	if v >= w.backlog {
		w.fullOnce.Do(func() { close(w.full) })
	}
}

// observed returns cfg with an Observer that counts each message the
// library's side committed (with add) and its handling's duration, from
// before the claim's BEGIN to after its COMMIT: what the hand-written side
// times around its transaction. The inbox keeps the benchmark's plain pool,
// and so the claim round a user's pool gets; a pool wrapped to time the
// transactions would send the claims through pgx's batch instead. The
// Observer's own cost (a closure per message in the core) is on the
// library's side only.
func (w *window) observed(cfg dedupe.Config) dedupe.Config {
	cfg.Observer = windowObserver{done: func(d dedupe.HandleDone) {
		if d.Outcome == dedupe.OutcomeClaimed {
			w.lat.add(d.Duration)
			w.add(1)
		}
	}}
	return cfg
}

// windowObserver reports every handling's end to done.
type windowObserver struct {
	dedupe.NopObserver
	done func(dedupe.HandleDone)
}

// StartHandle returns ctx and the window's done, the same for every message.
func (o windowObserver) StartHandle(ctx context.Context, _ dedupe.HandleInfo) (context.Context, func(dedupe.HandleDone)) {
	return ctx, o.done
}

// fail reports a consumer's error; the first one ends the measurement.
func (w *window) fail(err error) {
	w.failOnce.Do(func() { w.failed <- err })
}

// errBacklogDrained is a window that closed during the warm-up.
var errBacklogDrained = errors.New("the backlog was drained during the warm-up")

// measure waits for the first message, the warm-up and the window, and
// returns the messages finished in the window with their latencies and the
// process's usage meanwhile.
func (w *window) measure(ctx context.Context, m meter, warmup time.Duration) (*sample, error) {
	d := w.length
	wait := func(t <-chan time.Time, until <-chan struct{}) (bool, error) {
		select {
		case <-t:
			return false, nil
		case <-until:
			return true, nil
		case err := <-w.failed:
			return false, err
		case <-ctx.Done():
			return false, fmt.Errorf("%d of %d messages done: %w", w.done.Load(), w.backlog, ctx.Err())
		}
	}
	if _, err := wait(nil, w.first); err != nil {
		return nil, err
	}
	full, err := wait(time.After(warmup), w.full)
	if err != nil {
		return nil, err
	}
	if full {
		return nil, errBacklogDrained
	}
	u0 := m.read()
	n0 := w.done.Load()
	w.lat.on.Store(true)
	start := time.Now()
	full, err = wait(time.After(d), w.full)
	// A window in which nothing finished measured nothing: a relay counts
	// a cycle of up to 100 messages when it ends, and on a loaded machine
	// one cycle can outlast a short window (.ci/stress saw a tiny run's
	// relay row at 0 msgs/s). It goes on until something finishes.
	for err == nil && !full && w.done.Load() == n0 {
		full, err = wait(time.After(d), w.full)
	}
	n1 := w.done.Load()
	elapsed := time.Since(start)
	w.lat.on.Store(false)
	u := m.read().since(u0)
	if err != nil {
		return nil, err
	}
	return &sample{msgs: n1 - n0, elapsed: elapsed, lat: w.lat.take(), drainedEarly: full, usage: u}, nil
}

// backlogs sizes the transport runs' backlogs so that a run never runs out
// of messages inside its window: the expected throughput (the comparison's
// ceiling or -backlog-rate, or 1.5× the fastest run measured so far,
// whichever is higher)
// times the warm-up and window, times 1.5. Both sides of a round get the
// same backlog.
type backlogs struct {
	mu      sync.Mutex
	fastest map[string]float64
	sizes   map[string]int64
}

func (bl *backlogs) size(o *options, c *comparison, w, round int, window time.Duration) int64 {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	if bl.sizes == nil {
		bl.sizes, bl.fastest = map[string]int64{}, map[string]float64{}
	}
	k := fmt.Sprintf("%s/%d/%d", c.name, w, round)
	if n, ok := bl.sizes[k]; ok {
		return n
	}
	ceiling := c.ceiling
	if o.backlogRate > 0 {
		ceiling = o.backlogRate
	}
	rate := max(ceiling, 1.5*bl.fastest[c.name])
	n := int64(math.Ceil(rate*(o.warmup+window).Seconds()*1.5)) + 100
	bl.sizes[k] = n
	return n
}

// grow makes a round's backlog four times larger, after a run that drained
// it during the warm-up.
func (bl *backlogs) grow(c *comparison, w, round int) {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	k := fmt.Sprintf("%s/%d/%d", c.name, w, round)
	bl.sizes[k] *= 4
}

// observed records a measured throughput of a comparison.
func (bl *backlogs) observed(c *comparison, s *sample) {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	if bl.fastest == nil {
		bl.sizes, bl.fastest = map[string]int64{}, map[string]float64{}
	}
	bl.fastest[c.name] = max(bl.fastest[c.name], s.throughput())
}

// checkEffects fails a run that wrote an effect twice for one key.
func (b *bench) checkEffects(ctx context.Context) error {
	var dup int64
	if err := b.pool.QueryRow(ctx, sqlDuplicatedEffects).Scan(&dup); err != nil {
		return err
	}
	if dup != 0 {
		return fmt.Errorf("%d duplicated effects", dup)
	}
	return nil
}
