package dbtest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Together runs f in n goroutines released at the same instant by a
// barrier, and waits for all of them: the way to fire duplicates
// concurrently rather than one after another.
func Together(n int, f func(i int)) {
	var start, done sync.WaitGroup
	start.Add(1)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			start.Wait()
			f(i)
		}()
	}
	start.Done()
	done.Wait()
}

// WaitFor polls cond every 10ms until it holds, failing the test after d
// with what it was waiting for.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Background runs run(ctx) in a goroutine (a relay, a runner) until the test
// ends or the returned stop is called, which cancels ctx and waits up to 20s
// for run to return; an error or a hang fails the test.
func Background(t testing.TB, what string, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: %v", what, err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("%s did not stop within 20s", what)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
