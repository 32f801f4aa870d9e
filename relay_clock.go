package dedupe

import "time"

// The outbox and its relay take every time they store or compare from the
// database (clock_timestamp() when the statement runs; see outbox_sql.go).
// OutboxConfig.Clock is only a test seam that substitutes for the database's clock
// when the caller set it.

// dbNow is the "now" parameter of the outbox's statements: nil (SQL then
// takes the database's clock) unless the caller set OutboxConfig.Clock.
func (o *Outbox) dbNow() *time.Time { return o.cfg.now() }

// seconds passes a duration to SQL as seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }

// fromSeconds reads a duration SQL computed in seconds.
func fromSeconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
