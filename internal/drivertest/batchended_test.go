package drivertest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/exactlyonce/dedupe"
)

// TestBatchHandlerThatEndsItsTransaction is TestHandlerThatEndsItsTransaction
// for BatchConsumer, with a per-message handler and with a batch handler: in
// a batch of three, the middle message's handler ends the batch's
// transaction with a statement (ROLLBACK, then perhaps BEGIN, with writes
// before or after) and returns nil. Over two deliveries of the batch, that
// message is never reported processed and never runs again (OutcomePoisoned,
// the first time with ErrTxEnded; its effects counted exactly), no key's
// effect commits more than once, and a message reported processed has its
// effect committed. Two more cases end it with COMMIT (then perhaps
// BEGIN): what the handler committed may be reported a duplicate later, as
// under Consumer, but never without its effect, and no effect twice.
func TestBatchHandlerThatEndsItsTransaction(t *testing.T) {
	t.Run("pgx", func(t *testing.T) { t.Parallel(); batchEndsItsTransaction(t, pgxKit) })
	t.Run("database-sql-pgx-stdlib", func(t *testing.T) { t.Parallel(); batchEndsItsTransaction(t, sqlKit("pgx")) })
	t.Run("database-sql-lib-pq", func(t *testing.T) { t.Parallel(); batchEndsItsTransaction(t, sqlKit("postgres")) })
}

// commitCases end the transaction with COMMIT: what came before commits.
var commitCases = []endCase{
	{"InsertThenCommit", []string{"%s", "COMMIT"}, 1, 1},
	{"CommitAndBeginThenInsert", []string{"COMMIT; BEGIN", "%s"}, 0, 0},
}

func batchEndsItsTransaction[TTx any](t *testing.T, k kit[TTx]) {
	for _, perMessage := range []bool{true, false} {
		for _, ec := range append(endCases, commitCases...) {
			committing := slices.ContainsFunc(commitCases, func(c endCase) bool { return c.name == ec.name })
			name := ec.name + "/batch-handler"
			if perMessage {
				name = ec.name + "/per-message"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, k)
				inbox := b.newInbox(t, b.inbox, dedupe.Config{})
				const rogue = "end-1"
				// handle is one message's statements: the rogue's ec.stmts, an
				// INSERT of its effect for every other.
				handle := func(ctx context.Context, tx TTx, key string) error {
					insert := fmt.Sprintf(`INSERT INTO effects (key) VALUES ('%s')`, key)
					if key != rogue {
						return k.exec(ctx, tx, insert)
					}
					for _, s := range ec.stmts {
						if err := k.exec(ctx, tx, fill(s, insert)); err != nil {
							return err // pgx's guard refuses what follows the end
						}
					}
					return nil
				}
				cfg := dedupe.ConsumerConfig[string]{Scope: "orders", Key: func(m string) (string, error) { return m, nil }}
				var (
					c   *dedupe.BatchConsumer[string]
					err error
				)
				if perMessage {
					c, err = dedupe.NewBatchConsumer(inbox, cfg, handle)
				} else {
					c, err = dedupe.NewBatchConsumerFunc(inbox, cfg, func(ctx context.Context, tx TTx, msgs []string) error {
						for _, m := range msgs {
							if err := handle(ctx, tx, m); err != nil {
								return err
							}
						}
						return nil
					})
				}
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				keys := []string{"good-1", rogue, "good-2"}
				processed := map[string]bool{}
				for copyN := 1; copyN <= 2; copyN++ {
					res := c.HandleBatch(ctx, keys)
					for n, r := range res {
						done := r.Err == nil && (r.Outcome == dedupe.OutcomeClaimed || r.Outcome == dedupe.OutcomeDuplicate)
						if r.Err == nil && !done {
							t.Fatalf("copy %d: %s = %v with no error", copyN, keys[n], r.Outcome)
						}
						processed[keys[n]] = processed[keys[n]] || done
					}
					r := res[1]
					if committing && copyN == 2 && r.Err == nil && r.Outcome == dedupe.OutcomeDuplicate {
						continue // committed by the handler, checked below
					}
					if r.Outcome == dedupe.OutcomeClaimed || r.Outcome == dedupe.OutcomeDuplicate || r.Err == nil {
						t.Fatalf("copy %d: %s = %v, %v; a handler that ended its transaction must never be reported processed", copyN, rogue, r.Outcome, r.Err)
					}
					// A COMMIT that the guard pins on the rogue committed its
					// claim with its effect: retry, and the redelivery is a
					// duplicate.
					if r.Outcome != dedupe.OutcomePoisoned && !(committing && r.Outcome == dedupe.OutcomeRetry) {
						t.Fatalf("copy %d: %s: outcome %v (%v), want poisoned: a handler that ended its transaction never runs again", copyN, rogue, r.Outcome, r.Err)
					}
					if copyN == 1 && !errors.Is(r.Err, dedupe.ErrTxEnded) {
						t.Fatalf("copy 1: %s: error %v, want ErrTxEnded", rogue, r.Err)
					}
					if r.Outcome == dedupe.OutcomePoisoned && !errors.Is(r.Err, dedupe.ErrPoisoned) {
						t.Fatalf("copy %d: %s poisoned with %v, want ErrPoisoned", copyN, rogue, r.Err)
					}
				}
				want := ec.unguarded
				if k.name == pgxKit.name {
					want = ec.guarded
				}
				if got := b.effects(t, rogue); got != want {
					t.Fatalf("%s: effects = %d over two deliveries, want %d", rogue, got, want)
				}
				for _, key := range keys {
					got := b.effects(t, key)
					if got > 1 {
						t.Fatalf("%s: effects = %d over two deliveries; want at most 1", key, got)
					}
					if processed[key] && got != 1 {
						t.Fatalf("%s: reported processed with %d effects", key, got)
					}
				}
				rec, err := inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: rogue})
				if err != nil {
					t.Fatalf("lookup: %v; want the failed attempts recorded", err)
				}
				if rec.State == dedupe.StateComplete && (!committing || b.effects(t, rogue) != 1) {
					t.Fatalf("%s: key state %s; want in flight or failed", rogue, rec.State)
				}
			})
		}
	}
}
