package dedupe

import (
	"math/rand/v2"
	"time"
)

// Two delays grow with failures: a failed message's retry (its own
// attempts, scheduled in its row on the database's clock) and the relay's
// pause in a broker outage (in Run). Both double from MinBackoff up to
// MaxBackoff, with jitter so that relays and messages do not retry in step.

// backoff is the delay after the attempt-th failure.
func (r *Relay) backoff(attempt int) time.Duration {
	d := r.cfg.MinBackoff
	for i := 1; i < attempt && d < r.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.cfg.MaxBackoff)
}

// nextPause is the relay's pause after another failed cycle, given the last.
func (r *Relay) nextPause(pause time.Duration) time.Duration {
	return min(max(pause*2, r.cfg.MinBackoff), r.cfg.MaxBackoff)
}

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/5 + rand.N(d/5*2+1)
}
