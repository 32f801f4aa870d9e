package dedupe

import "time"

// Two delays grow with failures: a failed message's retry (its own
// attempts, scheduled in its row on the database's clock) and the relay's
// pause in a broker outage (in Run). Both are the relay's Backoff: doubling
// from MinBackoff up to MaxBackoff, shortened at random by up to 20% so
// that relays and messages do not retry in step.

// relayJitter is the spread of the relay's delays.
const relayJitter = 0.2

// backoffPolicy is the relay's Backoff.
func (r *Relay) backoffPolicy() Backoff {
	return Backoff{Min: r.cfg.MinBackoff, Max: r.cfg.MaxBackoff, Jitter: relayJitter}
}

// backoff is the jittered delay after a message's attempt-th failure.
func (r *Relay) backoff(attempt int) time.Duration { return r.backoffPolicy().Delay(attempt) }

// nextPause is the relay's pause after another failed cycle, given the last
// (unjittered; jitter each wait with r.jitter).
func (r *Relay) nextPause(pause time.Duration) time.Duration { return r.backoffPolicy().Next(pause) }

// jitter spreads d as the relay's delays are spread.
func (r *Relay) jitter(d time.Duration) time.Duration { return r.backoffPolicy().Jittered(d) }
