package dedupe

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// ClaimBatch claims many keys inside the caller's transaction with one
// statement (plus one read when some keys already exist), for transports that
// deliver batches. The result is parallel to keys. A key that appears more
// than once in keys is claimed once: its later occurrences report
// OutcomeDuplicate with an empty Result, or OutcomeConflict when their
// fingerprint differs from the first occurrence's.
//
// As with Claim, the caller runs effects only for OutcomeClaimed and the
// claims commit or roll back with tx. If one message of the batch fails, roll
// back and fall back to one transaction per message (or savepoints), so that
// the failure neither loses nor duplicates the others.
func (i *Inbox) ClaimBatch(ctx context.Context, tx pgx.Tx, keys []Key) ([]*Claim, error) {
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, err
		}
	}
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
	}
	byKey := make(map[[2]string]int, len(keys)) // (scope, id) → index in items
	var items []item
	for n, k := range keys {
		id := [2]string{k.Scope, k.ID}
		if j, ok := byKey[id]; ok {
			out[n] = &Claim{Key: k, Outcome: OutcomeDuplicate, Result: &Result{}}
			if fp := items[j].key.Fingerprint; len(fp) > 0 && len(k.Fingerprint) > 0 && string(fp) != string(k.Fingerprint) {
				out[n] = &Claim{Key: k, Outcome: OutcomeConflict}
			}
			continue
		}
		byKey[id] = len(items)
		items = append(items, item{key: k, first: n, token: rand.Int64()})
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
	now := i.cfg.Clock()
	rows, err := tx.Query(ctx, i.q.claimBatch, scopes, ids, fps, tokens, string(StateComplete),
		(*time.Time)(nil), now, now.Add(i.cfg.Retention), i.cfg.maxAttemptsParam())
	if err != nil {
		return nil, translate(err)
	}
	var (
		scope, id, state string
		attempts         int
	)
	_, err = pgx.ForEachRow(rows, []any{&scope, &id, &state, &attempts}, func() error {
		it := items[byKey[[2]string{scope, id}]]
		c := &Claim{Key: keys[it.first], Attempt: attempts, Token: it.token, Outcome: OutcomeClaimed}
		if State(state) == StateFailed {
			c.Outcome = OutcomePoisoned
		}
		out[it.first] = c
		return nil
	})
	if err != nil {
		return nil, translate(err)
	}

	// Classify the keys the upsert did not take.
	var missScopes, missIDs []string
	for _, it := range items {
		if out[it.first] == nil {
			missScopes = append(missScopes, it.key.Scope)
			missIDs = append(missIDs, it.key.ID)
		}
	}
	if len(missScopes) == 0 {
		return out, nil
	}
	rows, err = tx.Query(ctx, i.q.lookupBatch, missScopes, missIDs)
	if err != nil {
		return nil, translate(err)
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Record, error) { return scanRecord(r) })
	if err != nil {
		return nil, translate(err)
	}
	for _, rec := range recs {
		n := items[byKey[[2]string{rec.Key.Scope, rec.Key.ID}]].first
		out[n] = classify(keys[n], rec)
	}
	for _, it := range items {
		if out[it.first] == nil {
			// Deleted between the statements, or invisible to this snapshot.
			return nil, errors.Join(ErrRetryable, errors.New("dedupe: a batch key vanished while being claimed"))
		}
	}
	return out, nil
}
