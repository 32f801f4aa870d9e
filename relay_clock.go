package dedupe

import "time"

// The outbox and its relay take every time they store or compare from the
// database (clock_timestamp() when the statement runs; see outbox_sql.go).
// Config.Clock is only a test seam that substitutes for the database's clock
// when the caller set it. The core's Config.withDefaults fills a missing
// Clock with time.Now, which would make the application's clock decide, so
// the outbox looks at the caller's Config before the defaults.

// userClock returns the Clock the caller set in cfg, or nil.
func userClock(cfg *Config) func() time.Time {
	if cfg == nil {
		return nil
	}
	return cfg.Clock
}

// dbNow is the "now" parameter of the outbox's statements: nil (SQL then
// takes the database's clock) unless the caller set Config.Clock.
func (o *Outbox) dbNow() *time.Time {
	if o.clock == nil {
		return nil
	}
	t := o.clock()
	return &t
}

// seconds passes a duration to SQL as seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }

// fromSeconds reads a duration SQL computed in seconds.
func fromSeconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
