// Package batchclaim is the batch claim's round (the root's
// Inbox.ClaimBatch and BatchConsumer): its distinct keys in a fixed order
// (Plan), and the upsert's rows read back onto them without an allocation
// per row (Send). The root builds the statement and its arguments and turns
// what Send learnt into claims; this package knows keys only as a scope and
// an id.
package batchclaim

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"unsafe"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/pgbatch"
)

// What the upsert did to a distinct key (Send).
const (
	Missed   = iota // the upsert left the stored row alone
	Taken           // claimed: a new key, or an expired lease taken over
	Poisoned        // the takeover found the attempts used up
)

// Send runs the batch claim's upsert (query with args) on q for the keys of
// p, and savepoint right after it when it is not "": in the same round trip
// where q pipelines (pgx), else as a statement of its own after it. It
// returns, per distinct key of p, what the upsert did (Missed, Taken,
// Poisoned) and the attempts of a key it claimed.
//
// The rows come back as raw key bytes matched to the sorted keys (where the
// previous row's key ended, else by binary search), so nothing is allocated
// per row (database/sql, which gives no raw values, scans them as strings).
// The upsert returns the key, its attempts, whether it failed and, when p
// has several scopes, the scope.
func Send(ctx context.Context, q pgbatch.Querier, query string, args []any, savepoint string, p *Plan) (state []uint8, attempts []int, err error) {
	var (
		rows pgx.Rows
		// after ends the claim's statement: it reads the savepoint's reply
		// when it was pipelined, else sends the savepoint.
		after = func() error { return nil }
	)
	if s, ok := q.(interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}); ok && savepoint != "" {
		b := &pgx.Batch{}
		b.Queue(query, args...)
		b.Queue(savepoint)
		br := s.SendBatch(ctx, b)
		defer br.Close() //nolint:errcheck // read by after on success
		after = br.Close
		rows, err = br.Query()
	} else {
		if savepoint != "" {
			after = func() error { _, err := q.Exec(ctx, savepoint); return err }
		}
		rows, err = q.Query(ctx, query, args...)
	}
	if err != nil {
		return nil, nil, err
	}
	m := len(p.IDs)
	state = make([]uint8, m)
	attempts = make([]int, m)
	var (
		attempt    int
		failed     bool
		key, scope string
		next       int // where the next row's key is, when the rows come in the keys' order
	)
	ncol := 3 // key, attempts, failed
	if p.Scopes != nil {
		ncol = 4 // and scope
	}
	rawDest := []any{nil, &attempt, &failed, nil}[:ncol] // key and scope read raw
	strDest := []any{&key, &attempt, &failed, &scope}[:ncol]
	for rows.Next() {
		if raw := rows.RawValues(); raw != nil {
			if err := rows.Scan(rawDest...); err != nil {
				rows.Close()
				return nil, nil, err
			}
			key = unsafeString(raw[0])
			if p.Scopes != nil {
				scope = unsafeString(raw[3])
			}
		} else if err := rows.Scan(strDest...); err != nil {
			rows.Close()
			return nil, nil, err
		}
		if p.Scopes == nil {
			scope = p.Scope
		}
		j, ok := p.FindFrom(next, scope, key)
		next = j + 1
		if !ok || state[j] != Missed {
			rows.Close()
			return nil, nil, errors.New("dedupe: the batch claim returned a key it was not given")
		}
		state[j], attempts[j] = Taken, attempt
		if failed {
			state[j] = Poisoned
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if err := after(); err != nil {
		return nil, nil, err
	}
	return state, attempts, nil
}

// Plan is a batch's distinct keys in a fixed order: an upsert cannot
// touch a row twice, and concurrent batches that lock in the same order
// cannot deadlock. The order is (scope, id), bytewise.
type Plan struct {
	Scope  string   // the scope of every key, when Scopes is nil
	Scopes []string // per distinct key, when the keys have several scopes
	IDs    []string // per distinct key, sorted (within scope)
	firsts []int    // per distinct key, its first index in keys; nil: j itself
	items  []int    // per index in keys, its distinct key; nil: n itself
}

// NewPlan plans keys, whose scope and id parts returns; keys must not be
// empty.
func NewPlan[K any](keys []K, parts func(*K) (scope, id string)) Plan {
	compareKeys := func(a, b *K) int {
		as, ai := parts(a)
		bs, bi := parts(b)
		return cmp.Or(strings.Compare(as, bs), strings.Compare(ai, bi))
	}
	scope0, _ := parts(&keys[0])
	b := Plan{Scope: scope0}
	single := true
	sorted := true // strictly: sorted and distinct
	for n := 1; n < len(keys); n++ {
		scope, _ := parts(&keys[n])
		single = single && scope == b.Scope
		sorted = sorted && compareKeys(&keys[n-1], &keys[n]) < 0
	}
	if sorted {
		// Already sorted and distinct (a transport's batch often is): the
		// distinct keys are the keys.
		b.IDs = make([]string, len(keys))
		for n := range keys {
			_, b.IDs[n] = parts(&keys[n])
		}
	} else {
		// Sort the indexes, the first occurrence of a key first, and keep
		// one per key.
		order := make([]int, len(keys))
		for n := range order {
			order[n] = n
		}
		slices.SortFunc(order, func(a, c int) int { return cmp.Or(compareKeys(&keys[a], &keys[c]), cmp.Compare(a, c)) })
		b.items = make([]int, len(keys))
		for x, n := range order {
			if x == 0 || compareKeys(&keys[order[x-1]], &keys[n]) != 0 {
				b.firsts = append(b.firsts, n)
				_, id := parts(&keys[n])
				b.IDs = append(b.IDs, id)
			}
			b.items[n] = len(b.firsts) - 1
		}
	}
	if !single {
		b.Scopes = make([]string, len(b.IDs))
		for j := range b.Scopes {
			b.Scopes[j], _ = parts(&keys[b.First(j)])
		}
	}
	return b
}

// First returns the index in keys of distinct key j's first occurrence.
func (b *Plan) First(j int) int {
	if b.firsts == nil {
		return j
	}
	return b.firsts[j]
}

// Item returns the distinct key of keys[n].
func (b *Plan) Item(n int) int {
	if b.items == nil {
		return n
	}
	return b.items[n]
}

// ScopeOf returns distinct key j's scope.
func (b *Plan) ScopeOf(j int) string {
	if b.Scopes == nil {
		return b.Scope
	}
	return b.Scopes[j]
}

// FindFrom is Find that looks at distinct key j first: the rows of an
// insert come back in the order of its input, which is the keys' order, so
// the row after key j-1's is usually key j's (or a later one's, when keys
// between them were taken already).
func (b *Plan) FindFrom(j int, scope, id string) (int, bool) {
	if j < len(b.IDs) && b.IDs[j] == id && b.ScopeOf(j) == scope {
		return j, true
	}
	return b.Find(scope, id)
}

// Find returns the distinct key (scope, id) by binary search.
func (b *Plan) Find(scope, id string) (int, bool) {
	lo, hi := 0, len(b.IDs)
	for lo < hi {
		j := int(uint(lo+hi) >> 1)
		if c := cmp.Or(strings.Compare(b.ScopeOf(j), scope), strings.Compare(b.IDs[j], id)); c < 0 {
			lo = j + 1
		} else {
			hi = j
		}
	}
	return lo, lo < len(b.IDs) && b.ScopeOf(lo) == scope && b.IDs[lo] == id
}

// unsafeString views raw bytes as a string without copying, for a lookup
// that does not keep it (the bytes belong to the row being read).
func unsafeString(raw []byte) string {
	return unsafe.String(unsafe.SliceData(raw), len(raw))
}
