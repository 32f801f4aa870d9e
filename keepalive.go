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
	claim Claim // the renewed copy
}

// KeepAlive renews the lease of the leased claim c (from Begin) every
// interval (Config.Lease/3 when interval is 0) until Stop is called or ctx
// ends, for work that may outlast one lease. It does not modify c.
//
// Each renewal may take as long as the lease still holds, less one interval:
// a slow database delays a renewal without failing it. Lost is closed, and
// Stop returns an error matching ErrLeaseLost, when a renewal is refused
// (the lease expired and another attempt took the key over, or an operator
// released it) or when renewals kept failing until no more than one interval
// of the lease was left: past that point another attempt may take the key
// over. Either way the work should stop, because its Complete will be
// refused too. The lease is measured as Claim.LeaseLeft measures it, on this
// process's monotonic clock from what the database granted.
func (i *Inbox) KeepAlive(ctx context.Context, c *Claim, interval time.Duration) *Heartbeat {
	if interval <= 0 {
		interval = i.cfg.Lease / 3
	}
	h := &Heartbeat{lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	if c != nil {
		h.claim = *c
	}
	if c == nil || c.Outcome != OutcomeClaimed {
		h.err = ErrLeaseLost
		close(h.lost)
		close(h.done)
		return h
	}
	claim := *c // renewed by the renewer alone; h.claim is the published copy
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
			err := i.renew(rctx, &claim, interval)
			if rctx.Err() != nil {
				return // stopped: not a failed renewal
			}
			if obs := i.cfg.Observer; obs != nil {
				obs.LeaseRenewed(ctx, claim.Key, err)
			}
			h.mu.Lock()
			switch {
			case err == nil:
				h.claim = claim
			case !errors.Is(err, ErrLeaseLost) && claim.LeaseLeft() > interval:
				i.cfg.Logger.WarnContext(ctx, "dedupe: lease renewal failed; retrying", "scope", claim.Key.Scope,
					"key", claim.Key.ID, "lease_left", claim.LeaseLeft(), "err", err)
			default:
				if !errors.Is(err, ErrLeaseLost) {
					err = fmt.Errorf("%w: renewals failed until the lease was about to run out: %w", ErrLeaseLost, bare(err))
				}
				h.err = err
				h.mu.Unlock()
				if obs := i.cfg.Observer; obs != nil {
					obs.LeaseLost(ctx, claim.Key, err)
				}
				close(h.lost)
				return
			}
			h.mu.Unlock()
		}
	}()
	return h
}

// renew extends the lease once, giving up one interval before it runs out.
func (i *Inbox) renew(ctx context.Context, c *Claim, interval time.Duration) error {
	budget := c.LeaseLeft() - interval
	if budget <= 0 {
		return fmt.Errorf("dedupe: less than one renewal interval (%s) of the lease is left", interval)
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	return i.Extend(ctx, c, 0)
}

// Lost is closed when the lease was lost.
func (h *Heartbeat) Lost() <-chan struct{} { return h.lost }

// LockedUntil is the end of the lease as last renewed, on the database's
// clock.
func (h *Heartbeat) LockedUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.claim.LockedUntil
}

// LeaseLeft is how much of the lease, as last renewed, is left on this
// process's clock (see Claim.LeaseLeft).
func (h *Heartbeat) LeaseLeft() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.claim.LeaseLeft()
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
