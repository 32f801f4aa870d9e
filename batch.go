package dedupe

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/batchclaim"
)

// ClaimBatch claims many keys inside the caller's transaction with one
// statement (plus one read when some keys already exist), for transports that
// deliver batches. The result is parallel to keys, and each key gets the
// outcome Claim would give it in tx. A key that appears more than once in keys
// is claimed once: when its first occurrence is claimed, the later ones
// report OutcomeDuplicate with an empty Result (or OutcomeConflict when their
// fingerprint differs from the first's); otherwise each occurrence reports
// what the stored key says (duplicate, poisoned, in flight, conflict).
//
// As with Claim, the caller runs effects only for OutcomeClaimed and the
// claims commit or roll back with tx. If one message of the batch fails, roll
// back and fall back to one transaction per message (or savepoints), so that
// the failure neither loses nor duplicates the others.
func (i *Inbox) ClaimBatch(ctx context.Context, tx Querier, keys []Key) ([]*Claim, error) {
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, err
		}
		if err := i.reentrant(ctx, k); err != nil {
			return nil, err
		}
	}
	return i.claimBatch(ctx, tx, keys, i.cfg.maxAttemptsParam(), false)
}

// claimBatch is ClaimBatch for valid keys with an attempt limit of its own
// (0 = none). With savepoint, ClaimSavepoint is taken right after the claim
// statement: in the same round trip where tx pipelines (pgx), else as a
// statement of its own after it.
//
// The batch claim costs about what a hand-written INSERT … SELECT FROM
// unnest costs: keys of one scope (the common case) travel as that scope
// and one array of keys (sqlClaimBatchScope), keys of several scopes as
// two arrays (sqlClaimBatch); the rows come back as raw key bytes matched
// to the sorted keys, so nothing is allocated per row (internal/batchclaim);
// and the claims share one allocation.
func (i *Inbox) claimBatch(ctx context.Context, tx Querier, keys []Key, maxAttempts int, savepoint bool) ([]*Claim, error) {
	out := make([]*Claim, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	b := batchclaim.NewPlan(keys, keyParts)

	// Claim the distinct keys, in their sorted order.
	m := len(b.IDs)
	token := newToken() // one per batch: its keys are distinct
	sent, sentClock := time.Now(), i.cfg.now()
	var fps [][]byte // none when no key has a fingerprint: unnest pads the column with NULLs
	for j := range m {
		if fp := keys[b.First(j)].Fingerprint; fp != nil {
			if fps == nil {
				fps = make([][]byte, m)
			}
			fps[j] = fp
		}
	}
	query, scopes := i.q.claimBatchScope, any(b.Scope)
	if b.Scopes != nil {
		query, scopes = i.q.claimBatch, b.Scopes
	}
	args := []any{i.cfg.now(), scopes, b.IDs, string(StateComplete), fps, token, i.leaseArg, i.retentionArg, maxAttempts}
	sp := ""
	if savepoint {
		sp = sqlSavepoint
	}
	state, attempts, err := batchclaim.Send(ctx, tx, query, args, sp, &b)
	if err != nil {
		return nil, translate(err)
	}

	// Read the keys the upsert did not take.
	var recs []*Record
	var missScopes, missIDs []string
	for j := range m {
		if state[j] == batchclaim.Missed {
			missScopes = append(missScopes, b.ScopeOf(j))
			missIDs = append(missIDs, b.IDs[j])
		}
	}
	if len(missIDs) > 0 {
		rows, err := tx.Query(ctx, i.q.lookupBatch, i.cfg.now(), missScopes, missIDs)
		if err != nil {
			return nil, translate(err)
		}
		found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Record, error) { return scanRecord(r) })
		if err != nil {
			return nil, translate(err)
		}
		recs = make([]*Record, m)
		for _, rec := range found {
			if j, ok := b.Find(rec.Key.Scope, rec.Key.ID); ok {
				recs[j] = rec
			}
		}
		for j := range m {
			if state[j] == batchclaim.Missed && recs[j] == nil {
				// Deleted between the statements, or invisible to this snapshot.
				return nil, errors.Join(ErrRetryable, errors.New("dedupe: a batch key vanished while being claimed"))
			}
		}
	}

	// Each occurrence gets the outcome Claim would give it in tx.
	claims := make([]Claim, len(keys))
	for n, k := range keys {
		j := b.Item(n)
		f := b.First(j)
		c := &claims[n]
		switch {
		case state[j] == batchclaim.Taken && n == f:
			*c = Claim{Key: k, Attempt: attempts[j], Token: token, Outcome: OutcomeClaimed, inbox: i, sent: sent, sentClock: sentClock}
		case state[j] == batchclaim.Poisoned && n == f:
			*c = Claim{Key: k, Attempt: attempts[j], Outcome: OutcomePoisoned, inbox: i}
		case state[j] == batchclaim.Taken:
			// Claimed by its first occurrence in this transaction.
			*c = Claim{Key: k, Outcome: OutcomeDuplicate, Attempt: attempts[j], Result: &Result{}}
			if fp := keys[f].Fingerprint; len(fp) > 0 && len(k.Fingerprint) > 0 && string(fp) != string(k.Fingerprint) {
				*c = Claim{Key: k, Outcome: OutcomeConflict, Attempt: attempts[j]}
			}
		case state[j] == batchclaim.Poisoned:
			*c = Claim{Key: k, Outcome: OutcomePoisoned, Attempt: attempts[j]}
		default:
			classifyInto(c, k, recs[j])
		}
		out[n] = c
	}
	return out, nil
}

// keyParts is what batchclaim.Plan orders a key by.
func keyParts(k *Key) (scope, id string) { return k.Scope, k.ID }
