package dedupenats

import "time"

// Default delays of Config.
const (
	DefaultBackoffBase   = 100 * time.Millisecond
	DefaultBackoffMax    = 30 * time.Second
	DefaultInFlightDelay = time.Second
)
