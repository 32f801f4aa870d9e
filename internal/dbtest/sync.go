package dbtest

import (
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
