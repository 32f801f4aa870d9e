package dedupe

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// ScopeStats counts the keys of one scope in one state.
type ScopeStats struct {
	Scope string
	State State
	Count int64
	// OldestInFlight is the creation time of the oldest in-flight key (zero
	// for other states), and OldestInFlightAge its age on the database's
	// clock.
	OldestInFlight    time.Time
	OldestInFlightAge time.Duration
	// LiveLeases counts in-flight keys whose lease has not expired on the
	// database's clock.
	LiveLeases int64
}

// Stats counts keys by scope and state, for operators. It reads the whole
// table; do not call it on a hot path.
func (i *Inbox) Stats(ctx context.Context) ([]ScopeStats, error) {
	rows, err := i.db.Query(ctx, i.q.stats, i.cfg.now())
	if err != nil {
		return nil, translate(err)
	}
	var (
		out    []ScopeStats
		s      ScopeStats
		state  string
		oldest *time.Time
		age    *time.Duration
	)
	_, err = pgx.ForEachRow(rows, []any{&s.Scope, &state, &s.Count, &oldest, &age, &s.LiveLeases}, func() error {
		s.State = State(state)
		s.OldestInFlight, s.OldestInFlightAge = time.Time{}, 0
		if oldest != nil {
			s.OldestInFlight = *oldest
		}
		if age != nil {
			s.OldestInFlightAge = *age
		}
		out = append(out, s)
		return nil
	})
	return out, translate(err)
}
