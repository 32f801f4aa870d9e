package dedupe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// Claim claims key inside the caller's transaction tx, the transactional
// mode: the claim commits or rolls back with tx. The caller runs its effects
// only for OutcomeClaimed; for every other outcome it should roll back (or
// commit nothing of its own).
//
// A new key costs one statement, an existing key two. A concurrent
// transaction holding the same new key makes Claim wait until it ends. On
// OutcomeDuplicate, Claim.Result holds the stored result.
func (i *Inbox) Claim(ctx context.Context, tx pgx.Tx, key Key) (*Claim, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	return i.claim(ctx, tx, key, StateComplete, i.cfg.maxAttemptsParam())
}

// claimArgs are the parameters shared by sqlClaimInsert and sqlClaim.
type claimArgs struct {
	key         Key
	state       State
	token       int64
	lockedUntil *time.Time
	now         time.Time
	expires     time.Time
	maxAttempts int
}

// claim claims key with state (complete for transactional, in flight for
// leased). A new key costs one statement. An existing key costs a second one
// that reads it with a fresh snapshot (so it also sees a key committed by a
// concurrent transaction the insert waited for); only an in-flight key whose
// lease expired goes on to the takeover upsert.
func (i *Inbox) claim(ctx context.Context, q Querier, key Key, state State, maxAttempts int) (*Claim, error) {
	a := claimArgs{key: key, state: state, token: rand.Int64(), now: i.cfg.Clock(), maxAttempts: maxAttempts}
	if state == StateInFlight {
		t := a.now.Add(i.cfg.Lease)
		a.lockedUntil = &t
	}
	a.expires = a.now.Add(i.cfg.Retention)

	for range 3 {
		var attempts int
		err := q.QueryRow(ctx, i.q.claimInsert, key.Scope, key.ID, string(state), key.Fingerprint, a.token,
			a.lockedUntil, a.now, a.expires).Scan(&attempts)
		if err == nil {
			return a.claimed(attempts), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, translate(err)
		}
		rec, err := i.lookup(ctx, q, key)
		if errors.Is(err, ErrNotFound) {
			continue // released or purged in between, or rolled back after all
		} else if err != nil {
			return nil, err
		}
		if rec.State != StateInFlight || rec.LockedUntil == nil || rec.LockedUntil.After(a.now) {
			return classify(key, rec), nil
		}
		// In flight with an expired lease: its holder died or its attempt
		// failed. Take it over atomically (or find it poisoned).
		c, err := i.takeover(ctx, q, a)
		if c != nil || err != nil {
			return c, err
		}
		if rec, err = i.lookup(ctx, q, key); errors.Is(err, ErrNotFound) {
			continue
		} else if err != nil {
			return nil, err
		}
		return classify(key, rec), nil
	}
	return nil, fmt.Errorf("%w: key %s vanished while being claimed", ErrRetryable, key)
}

// takeover runs the takeover upsert; a nil claim means the row was not taken
// (another attempt took it first, or the fingerprints differ).
func (i *Inbox) takeover(ctx context.Context, q Querier, a claimArgs) (*Claim, error) {
	var (
		got      string
		attempts int
	)
	err := q.QueryRow(ctx, i.q.claim, a.key.Scope, a.key.ID, string(a.state), a.key.Fingerprint, a.token,
		a.lockedUntil, a.now, a.expires, a.maxAttempts).Scan(&got, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, translate(err)
	}
	if State(got) == StateFailed {
		return &Claim{Key: a.key, Outcome: OutcomePoisoned, Attempt: attempts}, nil
	}
	return a.claimed(attempts), nil
}

func (a claimArgs) claimed(attempt int) *Claim {
	c := &Claim{Key: a.key, Outcome: OutcomeClaimed, Token: a.token, Attempt: attempt}
	if a.lockedUntil != nil {
		c.LockedUntil = *a.lockedUntil
	}
	return c
}

// classify turns an existing row that the claim did not take into an outcome.
func classify(key Key, rec *Record) *Claim {
	c := &Claim{Key: key, Attempt: rec.Attempts}
	if rec.LockedUntil != nil {
		c.LockedUntil = *rec.LockedUntil
	}
	switch {
	case len(key.Fingerprint) > 0 && len(rec.Key.Fingerprint) > 0 && string(key.Fingerprint) != string(rec.Key.Fingerprint):
		c.Outcome = OutcomeConflict
	case rec.State == StateComplete:
		c.Outcome = OutcomeDuplicate
		c.Result = rec.Result
		if c.Result == nil {
			c.Result = &Result{}
		}
	case rec.State == StateFailed:
		c.Outcome = OutcomePoisoned
	default:
		c.Outcome = OutcomeInFlight
	}
	return c
}

// StoreResultTx stores r with a claim made in transactional mode (Claim,
// ClaimBatch), inside the same transaction tx, so that duplicates get r back
// once tx commits. It is refused with ErrLeaseLost when the claim is not
// this transaction's.
func (i *Inbox) StoreResultTx(ctx context.Context, tx Querier, c *Claim, r Result) error {
	if err := mustHold(c, "StoreResultTx"); err != nil {
		return err
	}
	headers, err := headersJSON(r.Headers)
	if err != nil {
		return fmt.Errorf("dedupe: encode result headers: %w", err)
	}
	tag, err := tx.Exec(ctx, i.q.storeResult, c.Key.Scope, c.Key.ID, r.Status, headers, r.Body, c.Token)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return leaseLost(c)
	}
	return nil
}

// RecordFailure counts a failed transactional attempt of key after its
// transaction rolled back (the claim went with it), for adapters that run
// handlers themselves; Consumer.Handle does this on its own. When the
// attempts (Config.MaxAttempts) are used up, or cause is Permanent, the key is
// marked failed and poisoned is true. A key that meanwhile completed, or that
// a live lease holds, is left alone and attempts is 0.
func (i *Inbox) RecordFailure(ctx context.Context, key Key, cause error) (attempts int, poisoned bool, err error) {
	if err := key.Validate(); err != nil {
		return 0, false, err
	}
	return i.recordFailure(ctx, key, cause, i.cfg.maxAttemptsParam())
}

func (i *Inbox) recordFailure(ctx context.Context, key Key, cause error, maxAttempts int) (int, bool, error) {
	msg := "failed"
	if cause != nil {
		msg = cause.Error()
	}
	now := i.cfg.Clock()
	var (
		state    string
		attempts int
	)
	err := i.db.QueryRow(ctx, i.q.recordFailure, key.Scope, key.ID, key.Fingerprint, now,
		now.Add(i.cfg.Retention), maxAttempts, IsPermanent(cause), msg).Scan(&state, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, translate(err)
	}
	return attempts, State(state) == StateFailed, nil
}
