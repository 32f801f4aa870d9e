package httpidem

import (
	"context"
	"time"
)

// Purge deletes the keys whose retention (Config.Inbox.Retention, 24 h by
// default) has run out, in bounded batches, and returns how many went. Keys
// in a live lease are never deleted. A client retrying after its key was
// purged executes the operation again, so retention must outlive the
// client's longest retry window.
func (m *Middleware) Purge(ctx context.Context) (int64, error) {
	return m.inbox.Purge(ctx, 0)
}

// RunPurger calls Purge every interval (Config.Inbox.Retention/24 when
// interval is 0, an hour by default) until ctx ends, logging failures, and
// returns ctx's error. Run it in one goroutine per process (or per
// deployment: concurrent purgers skip each other's rows).
func (m *Middleware) RunPurger(ctx context.Context, interval time.Duration) error {
	return m.inbox.RunPurger(ctx, interval)
}
