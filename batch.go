package dedupe

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"
	"unsafe"

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
// to the sorted keys (where the previous row's key ended, else by binary
// search), so nothing is allocated per row
// (database/sql, which gives no raw values, scans them as strings); and the
// claims share one allocation.
func (i *Inbox) claimBatch(ctx context.Context, tx Querier, keys []Key, maxAttempts int, savepoint bool) ([]*Claim, error) {
	out := make([]*Claim, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	b := planBatch(keys)

	// Claim the distinct keys, in their sorted order.
	m := len(b.ids)
	token := newToken() // one per batch: its keys are distinct
	sent, sentClock := time.Now(), i.cfg.now()
	var fps [][]byte // none when no key has a fingerprint: unnest pads the column with NULLs
	for j := range m {
		if fp := keys[b.first(j)].Fingerprint; fp != nil {
			if fps == nil {
				fps = make([][]byte, m)
			}
			fps[j] = fp
		}
	}
	query, scopes := i.q.claimBatchScope, any(b.scope)
	if b.scopes != nil {
		query, scopes = i.q.claimBatch, b.scopes
	}
	args := []any{i.cfg.now(), scopes, b.ids, string(StateComplete), fps, token, i.leaseArg, i.retentionArg, maxAttempts}
	var (
		rows pgx.Rows
		err  error
		// after ends the claim's statement: it reads the savepoint's reply
		// when it was pipelined, else sends the savepoint.
		after = func() error { return nil }
	)
	if p, ok := tx.(interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}); ok && savepoint {
		q := &pgx.Batch{}
		q.Queue(query, args...)
		q.Queue(sqlSavepoint)
		br := p.SendBatch(ctx, q)
		defer br.Close() //nolint:errcheck // read by after on success
		after = br.Close
		rows, err = br.Query()
	} else {
		if savepoint {
			after = func() error { _, err := tx.Exec(ctx, sqlSavepoint); return err }
		}
		rows, err = tx.Query(ctx, query, args...)
	}
	if err != nil {
		return nil, translate(err)
	}
	const (
		missed   = iota // the upsert left the stored row alone
		taken           // claimed: a new key, or an expired lease taken over
		poisoned        // the takeover found the attempts used up
	)
	state := make([]uint8, m)
	attempts := make([]int, m)
	var (
		attempt    int
		failed     bool
		key, scope string
		next       int // where the next row's key is, when the rows come in the keys' order
	)
	ncol := 3 // key, attempts, failed
	if b.scopes != nil {
		ncol = 4 // and scope
	}
	rawDest := []any{nil, &attempt, &failed, nil}[:ncol] // key and scope read raw
	strDest := []any{&key, &attempt, &failed, &scope}[:ncol]
	for rows.Next() {
		if raw := rows.RawValues(); raw != nil {
			if err := rows.Scan(rawDest...); err != nil {
				rows.Close()
				return nil, translate(err)
			}
			key = unsafeString(raw[0])
			if b.scopes != nil {
				scope = unsafeString(raw[3])
			}
		} else if err := rows.Scan(strDest...); err != nil {
			rows.Close()
			return nil, translate(err)
		}
		if b.scopes == nil {
			scope = b.scope
		}
		j, ok := b.findFrom(next, scope, key)
		next = j + 1
		if !ok || state[j] != missed {
			rows.Close()
			return nil, errors.New("dedupe: the batch claim returned a key it was not given")
		}
		state[j], attempts[j] = taken, attempt
		if failed {
			state[j] = poisoned
		}
	}
	if err := rows.Err(); err != nil {
		return nil, translate(err)
	}
	if err := after(); err != nil {
		return nil, translate(err)
	}

	// Read the keys the upsert did not take.
	var recs []*Record
	var missScopes, missIDs []string
	for j := range m {
		if state[j] == missed {
			missScopes = append(missScopes, b.scopeOf(j))
			missIDs = append(missIDs, b.ids[j])
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
			if j, ok := b.find(rec.Key.Scope, rec.Key.ID); ok {
				recs[j] = rec
			}
		}
		for j := range m {
			if state[j] == missed && recs[j] == nil {
				// Deleted between the statements, or invisible to this snapshot.
				return nil, errors.Join(ErrRetryable, errors.New("dedupe: a batch key vanished while being claimed"))
			}
		}
	}

	// Each occurrence gets the outcome Claim would give it in tx.
	claims := make([]Claim, len(keys))
	for n, k := range keys {
		j := b.item(n)
		f := b.first(j)
		c := &claims[n]
		switch {
		case state[j] == taken && n == f:
			*c = Claim{Key: k, Attempt: attempts[j], Token: token, Outcome: OutcomeClaimed, inbox: i, sent: sent, sentClock: sentClock}
		case state[j] == poisoned && n == f:
			*c = Claim{Key: k, Attempt: attempts[j], Outcome: OutcomePoisoned, inbox: i}
		case state[j] == taken:
			// Claimed by its first occurrence in this transaction.
			*c = Claim{Key: k, Outcome: OutcomeDuplicate, Attempt: attempts[j], Result: &Result{}}
			if fp := keys[f].Fingerprint; len(fp) > 0 && len(k.Fingerprint) > 0 && string(fp) != string(k.Fingerprint) {
				*c = Claim{Key: k, Outcome: OutcomeConflict, Attempt: attempts[j]}
			}
		case state[j] == poisoned:
			*c = Claim{Key: k, Outcome: OutcomePoisoned, Attempt: attempts[j]}
		default:
			classifyInto(c, k, recs[j])
		}
		out[n] = c
	}
	return out, nil
}

// batchPlan is a batch's distinct keys in a fixed order: an upsert cannot
// touch a row twice, and concurrent batches that lock in the same order
// cannot deadlock. The order is (scope, id), bytewise.
type batchPlan struct {
	scope  string   // the scope of every key, when scopes is nil
	scopes []string // per distinct key, when the keys have several scopes
	ids    []string // per distinct key, sorted (within scope)
	firsts []int    // per distinct key, its first index in keys; nil: j itself
	items  []int    // per index in keys, its distinct key; nil: n itself
}

func planBatch(keys []Key) batchPlan {
	b := batchPlan{scope: keys[0].Scope}
	single := true
	sorted := true // strictly: sorted and distinct
	for n := 1; n < len(keys); n++ {
		single = single && keys[n].Scope == b.scope
		sorted = sorted && compareKeys(keys[n-1], keys[n]) < 0
	}
	if sorted {
		// Already sorted and distinct (a transport's batch often is): the
		// distinct keys are the keys.
		b.ids = make([]string, len(keys))
		for n, k := range keys {
			b.ids[n] = k.ID
		}
	} else {
		// Sort the indexes, the first occurrence of a key first, and keep
		// one per key.
		order := make([]int, len(keys))
		for n := range order {
			order[n] = n
		}
		slices.SortFunc(order, func(a, c int) int { return cmp.Or(compareKeys(keys[a], keys[c]), cmp.Compare(a, c)) })
		b.items = make([]int, len(keys))
		for x, n := range order {
			if x == 0 || compareKeys(keys[order[x-1]], keys[n]) != 0 {
				b.firsts = append(b.firsts, n)
				b.ids = append(b.ids, keys[n].ID)
			}
			b.items[n] = len(b.firsts) - 1
		}
	}
	if !single {
		b.scopes = make([]string, len(b.ids))
		for j := range b.scopes {
			b.scopes[j] = keys[b.first(j)].Scope
		}
	}
	return b
}

// compareKeys orders keys by scope, then id.
func compareKeys(a, b Key) int {
	return cmp.Or(strings.Compare(a.Scope, b.Scope), strings.Compare(a.ID, b.ID))
}

// first returns the index in keys of distinct key j's first occurrence.
func (b *batchPlan) first(j int) int {
	if b.firsts == nil {
		return j
	}
	return b.firsts[j]
}

// item returns the distinct key of keys[n].
func (b *batchPlan) item(n int) int {
	if b.items == nil {
		return n
	}
	return b.items[n]
}

// scopeOf returns distinct key j's scope.
func (b *batchPlan) scopeOf(j int) string {
	if b.scopes == nil {
		return b.scope
	}
	return b.scopes[j]
}

// findFrom is find that looks at distinct key j first: the rows of an
// insert come back in the order of its input, which is the keys' order, so
// the row after key j-1's is usually key j's (or a later one's, when keys
// between them were taken already).
func (b *batchPlan) findFrom(j int, scope, id string) (int, bool) {
	if j < len(b.ids) && b.ids[j] == id && b.scopeOf(j) == scope {
		return j, true
	}
	return b.find(scope, id)
}

// find returns the distinct key (scope, id) by binary search.
func (b *batchPlan) find(scope, id string) (int, bool) {
	lo, hi := 0, len(b.ids)
	for lo < hi {
		j := int(uint(lo+hi) >> 1)
		if c := cmp.Or(strings.Compare(b.scopeOf(j), scope), strings.Compare(b.ids[j], id)); c < 0 {
			lo = j + 1
		} else {
			hi = j
		}
	}
	return lo, lo < len(b.ids) && b.scopeOf(lo) == scope && b.ids[lo] == id
}

// unsafeString views raw bytes as a string without copying, for a lookup
// that does not keep it (the bytes belong to the row being read).
func unsafeString(raw []byte) string {
	return unsafe.String(unsafe.SliceData(raw), len(raw))
}
