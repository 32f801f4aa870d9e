//go:build failover

package failover

import (
	"testing"
	"time"
)

// TestFailoverAsync measures what asynchronous replication (PostgreSQL's
// default) loses: an acknowledged message whose commit had not reached the
// standby when the primary died lost its effect, and the broker will not
// deliver it again. The count is reported, not asserted (it is usually 0
// with a process kill; a machine or network failure leaves a larger
// window). Nothing may be doubled or torn even so: claim and effect commit
// or vanish together.
func TestFailoverAsync(t *testing.T) {
	t.Parallel()
	total := 0
	start := time.Now()
	for run := 1; run <= *runs; run++ {
		res := runLoad(t, Options{}, *messages, *failovers)
		total += res.missing
		t.Logf("async run %d: %d unique messages (%d published), %d failovers: missing %d, duplicated %d, torn %d, "+
			"handled in the stall %d (%s), %v", run, res.unique, res.published, *failovers, res.missing, res.doubled, res.torn,
			res.stalled, res.stallEnd, res.elapsed.Round(time.Millisecond))
		if res.doubled != 0 || res.torn != 0 {
			t.Fatalf("async run %d: duplicated %d, torn %d; want 0, 0", run, res.doubled, res.torn)
		}
	}
	t.Logf("async: %d acknowledged messages lost their effect in %d runs of %d failovers (%v)", total, *runs, *failovers,
		time.Since(start).Round(time.Second))
}
