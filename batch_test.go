package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/exactlyonce/dedupe"
)

// batchState gives scope the same stored keys, one of each kind a batch
// claim can meet: complete with a result, a live lease, a released failed
// attempt, an expired lease, an expired lease with its attempts used up, a
// poisoned key, and a released key stored with another fingerprint. The
// clock must be advanced past the lease between prepareExpired and
// prepareLive.
func prepareExpired(t *testing.T, b *bundle, scope string) {
	t.Helper()
	ctx := context.Background()
	k := func(id string) dedupe.Key { return dedupe.Key{Scope: scope, ID: id} }
	if _, err := b.inbox.Begin(ctx, k("expired")); err != nil {
		t.Fatal(err)
	}
	spent, err := b.inbox.Begin(ctx, k("spent"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Fail(ctx, spent, errors.New("transient")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Begin(ctx, k("spent")); err != nil { // attempt 2 of 2, its lease left to expire
		t.Fatal(err)
	}
}

func prepareLive(t *testing.T, b *bundle, scope string) {
	t.Helper()
	ctx := context.Background()
	k := func(id string) dedupe.Key { return dedupe.Key{Scope: scope, ID: id} }
	done, err := b.inbox.Begin(ctx, k("done"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.Complete(ctx, done, dedupe.Result{Status: 7, Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Begin(ctx, k("held")); err != nil {
		t.Fatal(err)
	}
	retry, err := b.inbox.Begin(ctx, k("retry"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Fail(ctx, retry, errors.New("transient")); err != nil {
		t.Fatal(err)
	}
	poison, err := b.inbox.Begin(ctx, k("poison"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Fail(ctx, poison, dedupe.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}
	fp, err := b.inbox.Begin(ctx, dedupe.Key{Scope: scope, ID: "fp", Fingerprint: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.inbox.Fail(ctx, fp, errors.New("transient")); err != nil {
		t.Fatal(err)
	}
}

// TestClaimBatchOneScopeSameOutcomesAsSeveral: a batch of one scope (the
// statement with the scope as a scalar, with and without keys to sort and
// repeats to fold) gives every key the outcome, attempt, result and stored
// row that a batch of several scopes (the statement over a scope array)
// gives it, over every kind of stored key; and so does a batch claimed
// through database/sql.
func TestClaimBatchOneScopeSameOutcomesAsSeveral(t *testing.T) {
	t.Parallel()
	b := setup(t, dedupe.Config{MaxAttempts: 2})
	ctx := context.Background()
	scopes := []string{"one", "several", "sorted", "sql"}
	for _, s := range scopes {
		prepareExpired(t, b, s)
	}
	b.clock.Advance(dedupe.DefaultLease + 1)
	for _, s := range scopes {
		prepareLive(t, b, s)
	}

	type entry struct {
		id string
		fp string
	}
	batch := []entry{{"new2", ""}, {"done", ""}, {"new1", ""}, {"held", ""}, {"retry", ""}, {"new1", ""},
		{"expired", ""}, {"spent", ""}, {"poison", ""}, {"fp", "y"}, {"spent", ""}, {"new3", "a"},
		{"new3", "b"}, {"done", ""}, {"held", ""}, {"new3", "a"}, {"poison", ""}}
	want := []string{"claimed", "duplicate", "claimed", "in_flight", "claimed", "duplicate",
		"claimed", "poisoned", "poisoned", "conflict", "poisoned", "claimed",
		"conflict", "duplicate", "in_flight", "duplicate", "poisoned"}
	keysOf := func(scope string, entries []entry) []dedupe.Key {
		keys := make([]dedupe.Key, len(entries))
		for n, e := range entries {
			keys[n] = dedupe.Key{Scope: scope, ID: e.id}
			if e.fp != "" {
				keys[n].Fingerprint = []byte(e.fp)
			}
		}
		return keys
	}
	sqlDB := stdlib.OpenDBFromPool(b.db.Pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	claim := func(keys []dedupe.Key) []*dedupe.Claim {
		t.Helper()
		var claims []*dedupe.Claim
		if keys[0].Scope == "sql" {
			// Through database/sql, which gives no raw values.
			tx, err := sqlDB.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if claims, err = b.inbox.ClaimBatch(ctx, dedupe.SQLTx(tx), keys); err != nil {
				_ = tx.Rollback()
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		} else if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) (err error) {
			claims, err = b.inbox.ClaimBatch(ctx, tx, keys)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if len(claims) != len(keys) {
			t.Fatalf("%d claims for %d keys", len(claims), len(keys))
		}
		for n, c := range claims {
			if c.Key.Scope != keys[n].Scope || c.Key.ID != keys[n].ID || string(c.Key.Fingerprint) != string(keys[n].Fingerprint) {
				t.Fatalf("claims[%d].Key = %v, want %v", n, c.Key, keys[n])
			}
		}
		return claims
	}
	// describe is what a claim tells its caller, with the token reduced to
	// whether there is one.
	describe := func(c *dedupe.Claim) string {
		res := "-"
		if c.Result != nil {
			res = fmt.Sprintf("%d:%s", c.Result.Status, c.Result.Body)
		}
		return fmt.Sprintf("%s attempt=%d token=%t result=%s locked=%s", c.Outcome, c.Attempt, c.Token != 0, res,
			c.LockedUntil.UTC().Format("15:04:05.000"))
	}

	one := claim(keysOf("one", batch))
	// Several scopes: the same keys in "several", and one key of another
	// scope, which makes the statement take a scope array.
	several := claim(append(keysOf("several", batch), dedupe.Key{Scope: "zz-other", ID: "new1"}))
	if several[len(batch)].Outcome != dedupe.OutcomeClaimed {
		t.Errorf("the other scope's key: %v, want claimed", several[len(batch)].Outcome)
	}
	for n := range batch {
		if got := one[n].Outcome.String(); got != want[n] {
			t.Errorf("one scope: claims[%d] (%s) = %s, want %s", n, batch[n].id, got, want[n])
		}
		if d1, d2 := describe(one[n]), describe(several[n]); d1 != d2 {
			t.Errorf("claims[%d] (%s): one scope %s, several %s", n, batch[n].id, d1, d2)
		}
	}
	// database/sql: the same keys in "sql", once of one scope (as above)
	// and once with a key of another scope.
	viaSQL := claim(keysOf("sql", batch))
	for n := range batch {
		if d1, d2 := describe(one[n]), describe(viaSQL[n]); d1 != d2 {
			t.Errorf("claims[%d] (%s): pgx %s, database/sql %s", n, batch[n].id, d1, d2)
		}
	}
	viaSQL = claim(append(keysOf("sql", batch), dedupe.Key{Scope: "zz-other", ID: "new-sql"}))
	for n := range batch {
		if c := viaSQL[n]; c.Outcome == dedupe.OutcomeClaimed || (c.Outcome == dedupe.OutcomeDuplicate && c.Result == nil) {
			t.Errorf("claims[%d] (%s) again through database/sql: %s", n, batch[n].id, describe(c))
		}
	}
	if viaSQL[len(batch)].Outcome != dedupe.OutcomeClaimed {
		t.Errorf("database/sql, the other scope's key: %v, want claimed", viaSQL[len(batch)].Outcome)
	}

	// Sorted and distinct (nothing to sort or fold): the first
	// occurrences, in key order.
	var distinct []entry
	firsts := map[string]int{}
	for n, e := range batch {
		if _, ok := firsts[e.id]; !ok {
			firsts[e.id] = n
			distinct = append(distinct, e)
		}
	}
	slices.SortFunc(distinct, func(a, c entry) int { return compareStrings(a.id, c.id) })
	sorted := claim(keysOf("sorted", distinct))
	for n, e := range distinct {
		if d1, d2 := describe(one[firsts[e.id]]), describe(sorted[n]); d1 != d2 {
			t.Errorf("%s: unsorted %s, sorted %s", e.id, d1, d2)
		}
	}

	// The stored rows agree too.
	rows := func(scope string) string {
		t.Helper()
		r, err := b.db.Pool.Query(ctx, `SELECT key, state, attempts, fingerprint, locked_until, expires_at FROM dedupe_inbox
WHERE scope = $1 ORDER BY key`, scope)
		if err != nil {
			t.Fatal(err)
		}
		var out string
		for r.Next() {
			vals, err := r.Values()
			if err != nil {
				t.Fatal(err)
			}
			out += fmt.Sprintln(vals...)
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if r1, r2, r3 := rows("one"), rows("several"), rows("sorted"); r1 != r2 || r1 != r3 {
		t.Errorf("stored rows differ:\none scope:\n%s\nseveral:\n%s\nsorted:\n%s", r1, r2, r3)
	}
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestClaimBatchOneScopeAndSeveralConcurrentExactlyOnce: batches of one
// scope (sorted or not, with repeats) and batches of several scopes,
// released at the same instant over the same keys, some of them expired
// leases to take over, claim every key exactly once between them: one
// effect per key, and each taken-over key counts one attempt.
func TestClaimBatchOneScopeAndSeveralConcurrentExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const workers, size, expired = 12, 60, 10
	for n := range expired {
		if _, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "topic", ID: fmt.Sprintf("m-%02d", n)}); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.Advance(dedupe.DefaultLease + 1)

	for round := range 3 {
		if round > 0 {
			b.db.Exec(t, `DELETE FROM effects`)
			b.db.Exec(t, `UPDATE dedupe_inbox SET state = 'in_flight', attempts = 1, locked_until = $1
WHERE scope = 'topic' AND key < 'm-10'`, b.clock.Now().Add(-1))
			b.db.Exec(t, `DELETE FROM dedupe_inbox WHERE scope <> 'topic' OR key >= 'm-10'`)
		}
		claimed := make([]int, workers)
		together(workers, func(w int) {
			var keys []dedupe.Key
			for n := range size + size/3 { // a third of the keys twice
				keys = append(keys, dedupe.Key{Scope: "topic", ID: fmt.Sprintf("m-%02d", (n*7+w*13)%size)})
			}
			switch w % 3 {
			case 0: // one scope, sorted and distinct
				slices.SortFunc(keys, func(a, c dedupe.Key) int { return compareStrings(a.ID, c.ID) })
				keys = slices.CompactFunc(keys, func(a, c dedupe.Key) bool { return a.ID == c.ID })
			case 2: // several scopes
				keys = append(keys, dedupe.Key{Scope: fmt.Sprintf("w-%d", w), ID: "x"})
			}
			err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				claims, err := b.inbox.ClaimBatch(ctx, tx, keys)
				if err != nil {
					return err
				}
				for _, c := range claims {
					if c.Outcome == dedupe.OutcomeClaimed && c.Key.Scope == "topic" {
						claimed[w]++
						if _, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", c.Key.ID); err != nil {
							return err
						}
					}
				}
				return nil
			})
			if err != nil {
				t.Errorf("round %d, batch %d: %v", round, w, err)
			}
		})
		total := 0
		for _, n := range claimed {
			total += n
		}
		if total != size {
			t.Fatalf("round %d: claimed %d, want %d", round, total, size)
		}
		if dup := b.db.Count(t, "SELECT count(*) FROM (SELECT msg_key FROM effects GROUP BY msg_key HAVING count(*) <> 1) d"); dup != 0 ||
			b.db.Count(t, "SELECT count(DISTINCT msg_key) FROM effects") != size {
			t.Fatalf("round %d: %d keys without exactly one effect", round, dup)
		}
		if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE scope = 'topic' AND key < 'm-10' AND attempts = 2"); n != expired {
			t.Fatalf("round %d: %d taken-over keys at attempt 2, want %d", round, n, expired)
		}
	}
}

// TestClaimBatchRowsShareTheirTimestamps: a batch claim reads the database's
// clock once, so the rows of a batch share their creation time and expiry,
// as a hand-written batch insert with one timestamp parameter writes them,
// and the expiry index stores the value once (B-tree deduplication). Read
// per row and per use, as before, every row had a time of its own. The inbox
func TestClaimBatchRowsShareTheirTimestamps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.inbox.Config()
	cfg.Clock = nil // the database's clock: a test clock is one value for every row anyway
	inbox, err := dedupe.New(b.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keys := make([]dedupe.Key, 50)
	for n := range keys {
		keys[n] = dedupe.Key{Scope: "batch-time", ID: fmt.Sprintf("k%02d", n)}
	}
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := inbox.ClaimBatch(ctx, tx, keys)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	first, err := inbox.Lookup(ctx, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys[1:] {
		rec, err := inbox.Lookup(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.ExpiresAt.Equal(first.ExpiresAt) || !rec.CreatedAt.Equal(first.CreatedAt) {
			t.Fatalf("%s: created %v, expires %v; the batch's first key: created %v, expires %v",
				k.ID, rec.CreatedAt, rec.ExpiresAt, first.CreatedAt, first.ExpiresAt)
		}
	}
}
