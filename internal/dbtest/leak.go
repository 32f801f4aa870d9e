package dbtest

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"time"
)

// leakGrace is how long checkLeaks waits for goroutines that are already
// on their way out (a pool's last connection closing, a timer firing).
const leakGrace = 10 * time.Second

// checkLeaks reports the goroutines still running after the package's tests
// finished, other than the runtime's and the test framework's own: every
// goroutine a test starts must be stopped by the test. It is goleak's idea
// in a few lines, so that the core module's tests need no dependency beyond
// pgx.
func checkLeaks() error {
	deadline := time.Now().Add(leakGrace)
	for {
		leaked := leakedGoroutines()
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d goroutines leaked by the tests:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leakedGoroutines returns the stacks of the goroutines that are neither
// this one nor the runtime's or the testing package's.
func leakedGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var leaked []string
	for i, g := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 {
			continue // this goroutine
		}
		s := string(g)
		if expectedGoroutine(s) {
			continue
		}
		leaked = append(leaked, s)
	}
	return leaked
}

// expectedGoroutine reports the goroutines a test binary runs on its own:
// the testing framework's and the signal handler's.
func expectedGoroutine(stack string) bool {
	for _, f := range []string{
		"testing.(*M).",
		"testing.tRunner(",
		"testing.runTests",
		"testing.runFuzzing",
		"os/signal.signal_recv",
		"os/signal.loop",
		"runtime.ensureSigM",
	} {
		if strings.Contains(stack, f) {
			return true
		}
	}
	return false
}
