package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// op performs one unit of work (one message, or one batch) for worker w and
// returns how many messages it processed.
type op func(ctx context.Context, w int) (msgs int, err error)

// result is one measured row.
type result struct {
	scenario string
	baseline string // the scenario this one is compared with ("" for none)
	workers  int
	msgs     int64
	elapsed  time.Duration
	p50, p99 time.Duration // latency of one op
	unit     string        // what one op is: "msg" or "batch of N"
	ratio    float64       // throughput relative to the baseline (0 when none)
	note     string
}

// throughput is messages per second.
func (r *result) throughput() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.msgs) / r.elapsed.Seconds()
}

// measure runs f on workers goroutines for d (after a short warm-up that is
// not counted) and returns the throughput and op latencies. The first error
// stops the run.
func measure(ctx context.Context, workers int, warmup, d time.Duration, f op) (*result, error) {
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
	counting.Store(true)
	start := time.Now()
	sleepCtx(runCtx, d)
	counting.Store(false)
	elapsed := time.Since(start)
	close(stopAt)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := &result{workers: workers, msgs: msgs.Load(), elapsed: elapsed}
	r.p50, r.p99 = percentile(all, 0.50), percentile(all, 0.99)
	return r, nil
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
