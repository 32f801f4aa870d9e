package dedupe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Heartbeat renews one leased claim in the background; see Inbox.KeepAlive.
type Heartbeat struct {
	lost  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	err   error
	until time.Time
}

// KeepAlive renews the lease of the leased claim c (from Begin) every
// interval (Config.Lease/3 when interval is 0) until Stop is called or ctx
// ends, for work that may outlast one lease. It does not modify c.
//
// Lost is closed, and Stop returns an error matching ErrLeaseLost, when a
// renewal is refused (the lease expired and another attempt took the key
// over, or an operator released it) or when renewals kept failing (the
// database is unreachable; each attempt is bounded by interval) until less
// than one interval of the lease is left: past that point another attempt
// may take the key over. Either way the work should stop, because its
// Complete will be refused too.
func (i *Inbox) KeepAlive(ctx context.Context, c *Claim, interval time.Duration) *Heartbeat {
	if interval <= 0 {
		interval = i.cfg.Lease / 3
	}
	h := &Heartbeat{lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	if c != nil {
		h.until = c.LockedUntil
	}
	if c == nil || c.Outcome != OutcomeClaimed {
		h.err = ErrLeaseLost
		close(h.lost)
		close(h.done)
		return h
	}
	claim := *c // renew a copy: the caller's claim is not written concurrently
	rctx, cancel := context.WithCancel(ctx)
	go func() { // Stop cuts a renewal in flight short
		select {
		case <-h.stop:
		case <-h.done:
		}
		cancel()
	}()
	go func() {
		defer close(h.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			}
			actx, acancel := context.WithTimeout(rctx, interval)
			err := i.Extend(actx, &claim, 0)
			acancel()
			if rctx.Err() != nil {
				return // stopped: not a failed renewal
			}
			h.mu.Lock()
			switch {
			case err == nil:
				h.until = claim.LockedUntil
			case !errors.Is(err, ErrLeaseLost) && i.cfg.Clock().Add(interval).Before(h.until):
				i.cfg.Logger.WarnContext(ctx, "dedupe: lease renewal failed; retrying", "scope", claim.Key.Scope,
					"key", claim.Key.ID, "err", err)
			default:
				if !errors.Is(err, ErrLeaseLost) {
					err = fmt.Errorf("%w: renewals failed until the lease was about to run out: %w", ErrLeaseLost, err)
				}
				h.err = err
				h.mu.Unlock()
				close(h.lost)
				return
			}
			h.mu.Unlock()
		}
	}()
	return h
}

// Lost is closed when the lease was lost.
func (h *Heartbeat) Lost() <-chan struct{} { return h.lost }

// LockedUntil is the end of the lease as last renewed.
func (h *Heartbeat) LockedUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until
}

// Stop ends the renewals, waits for the renewer to finish and returns
// ErrLeaseLost (wrapped) if the lease was lost, else nil.
func (h *Heartbeat) Stop() error {
	h.once.Do(func() { close(h.stop) })
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}
