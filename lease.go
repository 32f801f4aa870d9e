package dedupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Begin claims key in leased mode, for work whose side effects cannot share a
// database transaction (calls to external APIs, scheduler tasks, HTTP
// requests that must answer 409 to a concurrent duplicate). The claim commits
// at once as in flight, held until Claim.LockedUntil (Config.Lease).
//
// On OutcomeClaimed the caller does the work and then calls Complete (or
// Fail); a long task calls Extend before the lease runs out. If the holder
// dies, the lease expires and the next Begin takes the key over with a new
// token, after which the old holder's Complete is refused with ErrLeaseLost.
//
// Other outcomes: OutcomeDuplicate (Claim.Result holds the stored result),
// OutcomeInFlight (a live lease; retry after Claim.LockedUntil),
// OutcomeConflict, OutcomePoisoned.
func (i *Inbox) Begin(ctx context.Context, key Key) (*Claim, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	return i.claim(ctx, i.db, key, StateInFlight, i.cfg.maxAttemptsParam())
}

// Complete stores result for a leased claim and marks the key complete. It is
// refused with ErrLeaseLost when the claim's token is no longer current.
func (i *Inbox) Complete(ctx context.Context, c *Claim, result Result) error {
	return i.CompleteTx(ctx, i.db, c, result)
}

// CompleteTx is Complete inside the caller's transaction (or any Querier), so
// that the work's database writes and the stored result commit together.
func (i *Inbox) CompleteTx(ctx context.Context, q Querier, c *Claim, result Result) error {
	if err := mustHold(c, "Complete"); err != nil {
		return err
	}
	headers, err := headersJSON(result.Headers)
	if err != nil {
		return fmt.Errorf("dedupe: encode result headers: %w", err)
	}
	now := i.cfg.Clock()
	tag, err := q.Exec(ctx, i.q.complete, c.Key.Scope, c.Key.ID, c.Token, result.Status, headers, result.Body,
		now, now.Add(i.cfg.Retention))
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return leaseLost(c)
	}
	return nil
}

// Fail ends a leased attempt that did not succeed and releases the key at
// once so that a retry may take it over, recording cause as the key's last
// error. When the attempts are used up, or cause is Permanent, the key is
// marked failed and Fail reports poisoned. It is refused with ErrLeaseLost
// when the claim's token is no longer current.
func (i *Inbox) Fail(ctx context.Context, c *Claim, cause error) (poisoned bool, err error) {
	if err := mustHold(c, "Fail"); err != nil {
		return false, err
	}
	msg := ""
	if cause != nil {
		msg = cause.Error()
	}
	var state string
	err = i.db.QueryRow(ctx, i.q.fail, c.Key.Scope, c.Key.ID, c.Token, i.cfg.Clock(),
		i.cfg.maxAttemptsParam(), IsPermanent(cause), msg).Scan(&state)
	if err != nil {
		if isNoRows(err) {
			return false, leaseLost(c)
		}
		return false, translate(err)
	}
	return State(state) == StateFailed, nil
}

// Extend renews the lease of a leased claim to d from now (Config.Lease when
// d is 0), for work that runs longer than one lease. It is refused with
// ErrLeaseLost when the claim's token is no longer current.
func (i *Inbox) Extend(ctx context.Context, c *Claim, d time.Duration) error {
	if err := mustHold(c, "Extend"); err != nil {
		return err
	}
	if d <= 0 {
		d = i.cfg.Lease
	}
	now := i.cfg.Clock()
	until := now.Add(d)
	tag, err := i.db.Exec(ctx, i.q.extend, c.Key.Scope, c.Key.ID, c.Token, until, now)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return leaseLost(c)
	}
	c.LockedUntil = until
	return nil
}

// Release deletes key whatever its state, so that the next delivery claims
// it afresh: an operator's decision to retry a failed key or to unblock a
// stuck one. A holder of the old claim is fenced off (ErrLeaseLost). It
// returns ErrNotFound when there was no such key.
func (i *Inbox) Release(ctx context.Context, key Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	tag, err := i.db.Exec(ctx, i.q.release, key.Scope, key.ID)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// ReleaseIdle is Release that refuses, with ErrInFlight, a key whose lease
// is live: the check and the delete are one statement, so an attempt that
// takes the key over in between is never cut off. It returns ErrNotFound
// when there was no such key.
func (i *Inbox) ReleaseIdle(ctx context.Context, key Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	tag, err := i.db.Exec(ctx, i.q.releaseIdle, key.Scope, key.ID, i.cfg.Clock())
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	if _, err := i.Lookup(ctx, key); err != nil {
		return err // ErrNotFound, or the database failed
	}
	return fmt.Errorf("%w: %s is held by a live lease", ErrInFlight, key)
}

// mustHold refuses op on a claim this attempt does not hold.
func mustHold(c *Claim, op string) error {
	if c == nil || c.Outcome != OutcomeClaimed {
		return fmt.Errorf("%w: %s needs a claim with outcome claimed", ErrLeaseLost, op)
	}
	return nil
}

// leaseLost is the refusal of a fenced write whose token is not current.
func leaseLost(c *Claim) error {
	return fmt.Errorf("%w: %s (token %d)", ErrLeaseLost, c.Key, c.Token)
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
