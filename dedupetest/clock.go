package dedupetest

import (
	"sync"
	"time"
)

// Clock is a controllable clock for dedupe.Config.Clock: set as the inbox's
// clock, it stands in for the database's clock in every lease, expiry and
// retention decision, so a test moves leases and expiries without sleeping.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time; pass it as dedupe.Config.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
