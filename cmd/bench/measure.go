package main

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// op performs one unit of work (one message, one batch or one request) for
// worker w and returns how many messages it processed.
type op func(ctx context.Context, w int) (msgs int, err error)

// sample is one measured run of one side: how many messages it completed in
// how long, the latency of each unit of work, and what the process spent
// meanwhile (socket writes to PostgreSQL, heap allocations).
type sample struct {
	msgs    int64
	elapsed time.Duration
	lat     []time.Duration
	// drainedEarly: a transport's backlog ran out before the window ended,
	// so elapsed stops where the last message was done.
	drainedEarly bool
	usage
}

// throughput is messages per second.
func (s *sample) throughput() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.msgs) / s.elapsed.Seconds()
}

// usage is what was spent over a window: PostgreSQL round trips (writes to
// the pool's sockets), heap allocations of the process, and CPU of the
// PostgreSQL backends serving the pool (when it can be read: pgOK).
type usage struct {
	writes         int64
	mallocs, bytes uint64
	pgTicks        int64
	pgOK           bool
}

// add sums two usages.
func (u usage) add(v usage) usage {
	return usage{writes: u.writes + v.writes, mallocs: u.mallocs + v.mallocs, bytes: u.bytes + v.bytes,
		pgTicks: u.pgTicks + v.pgTicks, pgOK: u.pgOK && v.pgOK}
}

// meter reads the counters that make up a usage.
type meter struct {
	wire *wire
	pg   *pgCPU
}

// reading is the counters at one moment.
type reading struct {
	writes         int64
	mallocs, bytes uint64
	pg             map[int32]int64
}

// read returns the counters now. It stops the world briefly and asks the
// server for its backends: call it at the edges of a window, never inside
// one.
func (m meter) read() reading {
	pg := m.pg.ticks()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return reading{writes: m.wire.writes.Load(), mallocs: ms.Mallocs, bytes: ms.TotalAlloc, pg: pg}
}

// since is what was spent from r0 to r.
func (r reading) since(r0 reading) usage {
	u := usage{writes: r.writes - r0.writes, mallocs: r.mallocs - r0.mallocs, bytes: r.bytes - r0.bytes}
	u.pgTicks, u.pgOK = cpuSince(r0.pg, r.pg)
	return u
}

// measure runs f on workers goroutines for d after an uncounted warm-up and
// returns the messages done, their op latencies and the usage of the
// measured window. The first error stops the run.
func measure(ctx context.Context, m meter, workers int, warmup, d time.Duration, f op) (*sample, error) {
	return measureWindow(ctx, m, workers, warmup, f, func(ctx context.Context) { sleepCtx(ctx, d) })
}

// measureWindow is measure with a window that lasts as long as window runs.
func measureWindow(ctx context.Context, m meter, workers int, warmup time.Duration, f op, window func(ctx context.Context)) (*sample, error) {
	var (
		msgs     atomic.Int64
		counting atomic.Bool
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
	)
	lat := make([][]time.Duration, workers)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopAt := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			for {
				select {
				case <-stopAt:
					return
				case <-runCtx.Done():
					return
				default:
				}
				start := time.Now()
				n, err := f(runCtx, w)
				if err != nil {
					if runCtx.Err() == nil {
						errOnce.Do(func() { firstErr = err; cancel() })
					}
					return
				}
				if counting.Load() {
					lat[w] = append(lat[w], time.Since(start))
					msgs.Add(int64(n))
				}
			}
		})
	}
	sleepCtx(runCtx, warmup)
	u0 := m.read()
	counting.Store(true)
	start := time.Now()
	window(runCtx)
	counting.Store(false)
	elapsed := time.Since(start)
	u := m.read().since(u0)
	close(stopAt)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &sample{msgs: msgs.Load(), elapsed: elapsed, lat: slices.Concat(lat...), usage: u}, nil
}

// probe runs f n times on one goroutine, after a few uncounted runs, and
// returns the usage per message: the round trips and allocations of the
// operation itself, undisturbed by other workers. The counters are
// process-wide, so nothing else may run meanwhile.
func probe(ctx context.Context, m meter, n int, f op) (perMsg cost, err error) {
	for range min(n, 20) {
		if _, err := f(ctx, 0); err != nil {
			return cost{}, err
		}
	}
	runtime.GC()
	u0 := m.read()
	msgs := 0
	for range n {
		k, err := f(ctx, 0)
		if err != nil {
			return cost{}, err
		}
		msgs += k
	}
	return costOf(m.read().since(u0), int64(msgs)), nil
}

// cost is a usage per message.
type cost struct {
	roundTrips, allocs, bytes float64
	// pgCPU is the PostgreSQL backends' CPU per message; pgOK says whether
	// it could be read.
	pgCPU time.Duration
	pgOK  bool
	valid bool
}

func costOf(u usage, msgs int64) cost {
	if msgs <= 0 {
		return cost{}
	}
	n := float64(msgs)
	return cost{roundTrips: float64(u.writes) / n, allocs: float64(u.mallocs) / n, bytes: float64(u.bytes) / n,
		pgCPU: time.Duration(float64(u.pgTicks) * float64(time.Second/clockTicks) / n), pgOK: u.pgOK, valid: true}
}

// sampleCost is the cost per message of the measured windows of samples.
func sampleCost(ss []*sample) cost {
	if len(ss) == 0 {
		return cost{}
	}
	u := usage{pgOK: true}
	var msgs int64
	for _, s := range ss {
		u = u.add(s.usage)
		msgs += s.msgs
	}
	return costOf(u, msgs)
}

// percentile returns the p-quantile of sorted latencies (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// latencies collects op latencies from many goroutines.
type latencies struct {
	mu  sync.Mutex
	on  atomic.Bool // record only inside the measured window
	all []time.Duration
}

func (l *latencies) add(d time.Duration) {
	if !l.on.Load() {
		return
	}
	l.mu.Lock()
	l.all = append(l.all, d)
	l.mu.Unlock()
}

func (l *latencies) take() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all
}
