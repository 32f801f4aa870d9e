package dedupenats

import "time"

// Default delays of Config.
const (
	DefaultBackoffBase   = 100 * time.Millisecond
	DefaultBackoffMax    = 30 * time.Second
	DefaultInFlightDelay = time.Second
)

// ExponentialBackoff returns a backoff that waits base after the first
// failed attempt and doubles per attempt, capped at maxDelay.
func ExponentialBackoff(base, maxDelay time.Duration) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		d := base
		for n := 1; n < attempt && d < maxDelay; n++ {
			d *= 2
		}
		return min(d, maxDelay)
	}
}
