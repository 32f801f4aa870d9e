package dedupe

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Keeping the inbox table: Purge deletes what Retention let go, Stats
// counts what is there.

// Purge deletes keys whose retention ran out more than olderThan ago (pass 0
// to delete every expired key), in batches of Config.PurgeBatchSize so that
// no statement holds many locks or runs long. A key's expiry is its last write
// plus Config.Retention. Keys in a live lease are never deleted. Purge walks
// the expires_at index (no full-table scan) and skips rows that consumers
// hold locked. It returns how many keys went; on error or cancellation it
// returns the count so far with the error.
//
// Retention must outlive the longest redelivery delay of the transport: a
// duplicate that arrives after its key was purged is processed again.
func (i *Inbox) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	return i.PurgeProgress(ctx, olderThan, nil)
}

// purged tells the Observer about a purge.
func (i *Inbox) purged(ctx context.Context, n int64, err error) (int64, error) {
	if obs := i.cfg.Observer; obs != nil {
		obs.Purged(ctx, n, err)
	}
	return n, err
}

// PurgeProgress is Purge calling progress (when not nil) with the running
// total after every batch. Expiry is judged on the database's clock. A
// negative olderThan is refused with a *ConfigError: it would delete keys
// whose retention has not run out.
func (i *Inbox) PurgeProgress(ctx context.Context, olderThan time.Duration, progress func(deleted int64)) (int64, error) {
	if olderThan < 0 {
		return 0, &ConfigError{Field: "olderThan", Reason: "must not be negative (it would purge keys still within their retention)"}
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return i.purged(ctx, total, err)
		}
		tag, err := i.db.Exec(ctx, i.q.purge, i.cfg.now(), olderThan, i.cfg.PurgeBatchSize)
		if err != nil {
			return i.purged(ctx, total, translate(err))
		}
		n := tag.RowsAffected()
		total += n
		if progress != nil && n > 0 {
			progress(total)
		}
		if n < int64(i.cfg.PurgeBatchSize) {
			return i.purged(ctx, total, nil)
		}
	}
}

// RunPurger calls Purge(ctx, 0) every interval (Config.Retention/24 when
// interval is 0, at least a second) until ctx ends, logging what it deleted
// and any failure, and returns ctx's error. Run it in one goroutine per
// process: concurrent purgers skip each other's rows.
func (i *Inbox) RunPurger(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = max(i.cfg.Retention/24, time.Second)
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if n, err := i.Purge(ctx, 0); err != nil && ctx.Err() == nil {
			i.cfg.Logger.ErrorContext(ctx, "dedupe: purge failed", "err", err)
		} else if n > 0 {
			i.cfg.Logger.InfoContext(ctx, "dedupe: purged expired keys", "count", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}

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
