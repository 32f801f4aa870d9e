package dedupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/headerjson"
)

// Begin claims key in leased mode, for work whose side effects cannot share a
// database transaction (calls to external APIs, scheduler tasks, HTTP
// requests that must answer 409 to a concurrent duplicate). The claim commits
// at once as in flight, held for Config.Lease on the database's clock
// (Claim.LeaseLeft tells how much of it is left on this process's clock).
//
// On OutcomeClaimed the caller does the work and then calls Complete (or
// Fail); a long task calls Extend (or runs under KeepAlive) before the lease
// runs out. If the holder dies, the lease expires and the next Begin takes
// the key over with a new token, after which the old holder's Complete is
// refused with ErrLeaseLost.
//
// Other outcomes: OutcomeDuplicate (Claim.Result holds the stored result),
// OutcomeInFlight (a live lease; retry after it), OutcomeConflict,
// OutcomePoisoned.
//
// A connection lost while Begin's statement was in flight does not leave the
// key blocked: Begin sends it again on a fresh connection with the same
// token, and finding its own token it holds the claim. When every try fails
// that way it returns an error matching ErrOutcomeUnknown.
func (i *Inbox) Begin(ctx context.Context, key Key) (*Claim, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if err := i.reentrant(ctx, key); err != nil {
		return nil, err
	}
	req := i.newClaimReq(key, StateInFlight, i.cfg.maxAttemptsParam())
	ctx, done := i.observe(ctx, key, "leased", nil)
	c, err := i.begin(ctx, key, req)
	switch {
	case err != nil:
		done(inFlightOutcome(err), 0, err)
	case c.Outcome == OutcomeClaimed:
		c.obsDone = done // reported by Complete or Fail
	default:
		done(c.Outcome, c.Attempt, c.Outcome.Err())
	}
	return c, err
}

// inFlightOutcome is the outcome an error of Begin reports to the Observer.
func inFlightOutcome(err error) Outcome {
	o, _ := inFlightOr(err)
	return o
}

func (i *Inbox) begin(ctx context.Context, key Key, req *claimReq) (*Claim, error) {
	var c *Claim
	err := i.idempotent(ctx, "Begin", key, func() error {
		b := &pgx.Batch{}
		round := i.queueClaim(b, req, readAll)
		sent := time.Now()
		if err := sendBatch(ctx, i.db, b); err != nil {
			return translate(err)
		}
		var err error
		c, _, err = i.settle(ctx, i.db, req, round, sent)
		return err
	})
	if err != nil {
		return nil, err
	}
	if c.Outcome == OutcomeClaimed && c.LeaseLeft() < i.cfg.Lease/2 {
		// The statement waited on a lock for much of the lease (it was
		// measured after the wait, so the lease is not wrong, only short):
		// renew it before handing it out.
		if err := i.Extend(ctx, c, 0); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// idempotentTries is how often a fenced, idempotent statement is sent when
// the connection fails under it.
const idempotentTries = 3

// idempotent runs op, an operation that is idempotent for its claim token,
// and runs it again (a fresh pool connection replaces a broken one) when the
// connection failed while its request may have reached the server. When
// every try failed that way, the error matches ErrOutcomeUnknown.
func (i *Inbox) idempotent(ctx context.Context, op string, key Key, run func() error) error {
	var err error
	for range idempotentTries {
		err = run()
		if err == nil || !mayHaveApplied(err) || ctx.Err() != nil {
			break
		}
		i.cfg.Logger.WarnContext(ctx, "dedupe: connection lost under a statement; sending it again",
			"op", op, "scope", key.Scope, "key", key.ID, "err", err)
	}
	if mayHaveApplied(err) {
		return &OutcomeUnknownError{Op: op, Key: key, Err: err}
	}
	return err
}

// Complete stores result for a leased claim and marks the key complete. It is
// refused with ErrLeaseLost when the claim's token is no longer current. It
// is idempotent for the claim: a Complete whose reply was lost is sent again
// and, finding the key complete under its own token, succeeds without
// rewriting the stored result.
func (i *Inbox) Complete(ctx context.Context, c *Claim, result Result) error {
	if err := mustHold(c, "Complete"); err != nil {
		return err
	}
	err := i.idempotent(ctx, "Complete", c.Key, func() error { return i.complete(ctx, i.db, c, result) })
	c.settled(OutcomeClaimed, nil, err)
	return err
}

// CompleteTx is Complete inside the caller's transaction (or any Querier), so
// that the work's database writes and the stored result commit together. If
// that transaction's COMMIT fails without a reply, Resolve tells whether it
// committed. The Observer is told of the handling when the completion is
// written into q: the inbox cannot see q's COMMIT, so a commit that fails
// afterwards is the caller's to report (its Fail then changes nothing the
// Observer was told).
func (i *Inbox) CompleteTx(ctx context.Context, q Querier, c *Claim, result Result) error {
	if err := mustHold(c, "Complete"); err != nil {
		return err
	}
	err := i.complete(ctx, q, c, result)
	c.settled(OutcomeClaimed, nil, err)
	return err
}

func (i *Inbox) complete(ctx context.Context, q Querier, c *Claim, result Result) error {
	headers, err := headerjson.Arg(result.Headers)
	if err != nil {
		return fmt.Errorf("dedupe: encode result headers: %w", bare(err))
	}
	tag, err := q.Exec(ctx, i.q.complete, i.cfg.now(), c.Key.Scope, c.Key.ID, c.Token, result.Status, headers,
		result.Body, i.cfg.Retention)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	rec, err := i.lookup(ctx, q, c.Key)
	switch {
	case err == nil && rec.Token == c.Token && rec.State == StateComplete:
		return nil // completed already by this claim: a retry after a lost reply
	case err != nil && !errors.Is(err, ErrNotFound):
		return err
	}
	return leaseLost(c)
}

// Fail ends a leased attempt that did not succeed and releases the key at
// once so that a retry may take it over, recording cause as the key's last
// error. When the attempts are used up, or cause is Permanent, the key is
// marked failed and Fail reports poisoned. It is refused with ErrLeaseLost
// when the claim's token is no longer current, and is idempotent for the
// claim like Complete.
func (i *Inbox) Fail(ctx context.Context, c *Claim, cause error) (poisoned bool, err error) {
	if err := mustHold(c, "Fail"); err != nil {
		return false, err
	}
	var state string
	err = i.idempotent(ctx, "Fail", c.Key, func() error {
		var attempts int
		err := i.db.QueryRow(ctx, i.q.fail, i.cfg.now(), c.Key.Scope, c.Key.ID, c.Token,
			i.cfg.maxAttemptsParam(), IsPermanent(cause), errorText(cause), i.cfg.Retention).Scan(&state, &attempts)
		if isNoRows(err) {
			return leaseLost(c)
		}
		return translate(err)
	})
	poisoned = err == nil && State(state) == StateFailed
	o := OutcomeRetry
	if poisoned {
		o = OutcomePoisoned
	}
	c.settled(o, cause, err)
	return poisoned, err
}

// Extend renews the lease of a leased claim to d from now on the database's
// clock (Config.Lease when d is 0), for work that runs longer than one
// lease, and updates c.LockedUntil and c.LeaseLeft. It is refused with
// ErrLeaseLost when the claim's token is no longer current.
func (i *Inbox) Extend(ctx context.Context, c *Claim, d time.Duration) error {
	if err := mustHold(c, "Extend"); err != nil {
		return err
	}
	if d <= 0 {
		d = i.cfg.Lease
	}
	return i.idempotent(ctx, "Extend", c.Key, func() error {
		var (
			until time.Time
			left  time.Duration
		)
		sent := time.Now()
		err := i.db.QueryRow(ctx, i.q.extend, i.cfg.now(), c.Key.Scope, c.Key.ID, c.Token, d).Scan(&until, &left)
		if isNoRows(err) {
			return leaseLost(c)
		}
		if err != nil {
			return translate(err)
		}
		c.setLease(&until, &left, sent)
		return nil
	})
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
// is live on the database's clock: the check and the delete are one
// statement, so an attempt that takes the key over in between is never cut
// off. It returns ErrNotFound when there was no such key.
func (i *Inbox) ReleaseIdle(ctx context.Context, key Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	tag, err := i.db.Exec(ctx, i.q.releaseIdle, i.cfg.now(), key.Scope, key.ID)
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
