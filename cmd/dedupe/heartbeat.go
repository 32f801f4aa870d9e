package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/exactlyonce/dedupe"
)

// heartbeat renews claim's lease to lease from now every interval until ctx
// ends (it returns nil) or the lease is lost: Extend is refused (released,
// or taken over after it expired), or renewing kept failing until the lease
// was about to run out. It then returns an error matching dedupe.ErrLeaseLost,
// and the caller must stop the work. claim.LockedUntil is updated; read it
// only after heartbeat returned.
func heartbeat(ctx context.Context, inbox *dedupe.Inbox, claim *dedupe.Claim, interval, lease time.Duration, log *slog.Logger) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, interval)
		err := inbox.Extend(cctx, claim, lease)
		cancel()
		switch {
		case err == nil:
			log.Debug("dedupe run: lease renewed", "key", claim.Key.String(), "until", claim.LockedUntil)
			continue
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, dedupe.ErrLeaseLost):
			return err
		}
		log.Warn("dedupe run: could not renew the lease", "key", claim.Key.String(), "until", claim.LockedUntil, "err", err)
		if time.Until(claim.LockedUntil) < interval {
			return fmt.Errorf("%w: renewing failed until the lease was about to run out: %w", dedupe.ErrLeaseLost, err)
		}
	}
}
