package dedupe

import (
	"math/rand/v2"
	"time"
)

// Backoff is the one exponential backoff every part of the library uses (a
// relay's failed messages and outage pauses, the adapters' redeliveries and
// retries, httpidem's retrying client): Min after the first failure,
// doubling per further failure up to Max, spread by Jitter so that many
// processes do not retry in step. Its zero value never waits.
type Backoff struct {
	// Min is the delay after the first failure.
	Min time.Duration
	// Max caps the delay. Values below Min are taken as Min.
	Max time.Duration
	// Jitter shortens each delay by a random part of up to this fraction of
	// it (0.2: each delay is drawn from 80% to 100% of its value), within
	// [0, 1], so that Max stays a true cap. Defaults to 0: exact delays.
	Jitter float64
}

// Delay returns the (jittered) delay after the attempt-th consecutive
// failure (from 1; lower values are taken as 1).
func (b Backoff) Delay(attempt int) time.Duration {
	hi := max(b.Max, b.Min)
	d := b.Min
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	return b.jitter(min(d, hi))
}

// Next returns the delay after another failure, given the last delay (0
// for none): the last doubled, within [Min, Max], without jitter. It suits a
// loop that keeps its delay rather than counting failures; jitter each wait
// with Jittered.
func (b Backoff) Next(last time.Duration) time.Duration {
	return min(max(last*2, b.Min), max(b.Max, b.Min))
}

// Jittered returns d shortened at random by up to Jitter of it.
func (b Backoff) Jittered(d time.Duration) time.Duration { return b.jitter(d) }

func (b Backoff) jitter(d time.Duration) time.Duration {
	j := min(max(b.Jitter, 0), 1)
	if d <= 0 || j == 0 {
		return d
	}
	spread := time.Duration(float64(d) * j)
	if spread <= 0 {
		return d
	}
	return d - rand.N(spread+1)
}
