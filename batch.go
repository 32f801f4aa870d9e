package dedupe

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
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
	return i.claimBatch(ctx, tx, keys, i.cfg.maxAttemptsParam())
}

// claimBatch is ClaimBatch for valid keys with an attempt limit of its own
// (0 = none).
func (i *Inbox) claimBatch(ctx context.Context, tx Querier, keys []Key, maxAttempts int) ([]*Claim, error) {
	out := make([]*Claim, len(keys))
	if len(keys) == 0 {
		return out, nil
	}

	// Distinct keys in a fixed order: an upsert cannot touch a row twice, and
	// concurrent batches that lock in the same order cannot deadlock.
	type item struct {
		key   Key
		first int   // index in keys
		token int64 // fencing token if the upsert takes it
		claim *Claim
		rec   *Record // the stored row, for keys the upsert did not take
	}
	byKey := make(map[[2]string]int, len(keys)) // (scope, id) → index in items
	var items []item
	for n, k := range keys {
		id := [2]string{k.Scope, k.ID}
		if _, ok := byKey[id]; ok {
			continue
		}
		byKey[id] = len(items)
		items = append(items, item{key: k, first: n, token: newToken()})
	}
	slices.SortFunc(items, func(a, b item) int {
		return cmp.Or(cmp.Compare(a.key.Scope, b.key.Scope), cmp.Compare(a.key.ID, b.key.ID))
	})
	for j, it := range items {
		byKey[[2]string{it.key.Scope, it.key.ID}] = j
	}

	scopes := make([]string, len(items))
	ids := make([]string, len(items))
	fps := make([][]byte, len(items))
	tokens := make([]int64, len(items))
	for j, it := range items {
		scopes[j], ids[j], fps[j], tokens[j] = it.key.Scope, it.key.ID, it.key.Fingerprint, it.token
	}
	rows, err := tx.Query(ctx, i.q.claimBatch, i.cfg.now(), scopes, ids, string(StateComplete), fps, tokens,
		i.leaseArg, i.retentionArg, maxAttempts)
	if err != nil {
		return nil, translate(err)
	}
	var (
		scope, id, state string
		attempts         int
	)
	_, err = pgx.ForEachRow(rows, []any{&scope, &id, &state, &attempts}, func() error {
		it := &items[byKey[[2]string{scope, id}]]
		c := &Claim{Key: keys[it.first], Attempt: attempts, Token: it.token, Outcome: OutcomeClaimed, inbox: i}
		if State(state) == StateFailed {
			c = &Claim{Key: keys[it.first], Attempt: attempts, Outcome: OutcomePoisoned, inbox: i}
		}
		it.claim = c
		return nil
	})
	if err != nil {
		return nil, translate(err)
	}

	// Read the keys the upsert did not take.
	var missScopes, missIDs []string
	for _, it := range items {
		if it.claim == nil {
			missScopes = append(missScopes, it.key.Scope)
			missIDs = append(missIDs, it.key.ID)
		}
	}
	if len(missScopes) > 0 {
		rows, err = tx.Query(ctx, i.q.lookupBatch, i.cfg.now(), missScopes, missIDs)
		if err != nil {
			return nil, translate(err)
		}
		recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Record, error) { return scanRecord(r) })
		if err != nil {
			return nil, translate(err)
		}
		for _, rec := range recs {
			items[byKey[[2]string{rec.Key.Scope, rec.Key.ID}]].rec = rec
		}
		for _, it := range items {
			if it.claim == nil && it.rec == nil {
				// Deleted between the statements, or invisible to this snapshot.
				return nil, errors.Join(ErrRetryable, errors.New("dedupe: a batch key vanished while being claimed"))
			}
		}
	}

	// Each occurrence gets the outcome Claim would give it in tx.
	for n, k := range keys {
		it := items[byKey[[2]string{k.Scope, k.ID}]]
		switch {
		case n == it.first && it.claim != nil:
			out[n] = it.claim
		case it.claim != nil && it.claim.Outcome == OutcomeClaimed:
			// Claimed by its first occurrence in this transaction.
			out[n] = &Claim{Key: k, Outcome: OutcomeDuplicate, Attempt: it.claim.Attempt, Result: &Result{}}
			if fp := it.key.Fingerprint; len(fp) > 0 && len(k.Fingerprint) > 0 && string(fp) != string(k.Fingerprint) {
				out[n] = &Claim{Key: k, Outcome: OutcomeConflict, Attempt: it.claim.Attempt}
			}
		case it.claim != nil:
			out[n] = &Claim{Key: k, Outcome: it.claim.Outcome, Attempt: it.claim.Attempt} // poisoned
		default:
			out[n] = classify(k, it.rec)
		}
	}
	return out, nil
}
