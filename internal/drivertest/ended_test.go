package drivertest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestHandlerThatEndsItsTransaction: a handler that ends the claim's
// transaction with a statement (ROLLBACK, then perhaps BEGIN, with writes
// before or after, in one statement or several) and returns nil is never
// reported processed, on every driver, and nothing of it runs twice: Handle
// returns OutcomePoisoned with ErrTxEnded, the key is marked failed in a
// fresh transaction, and the redeliveries, several at once, are settled
// failures that do not run the handler. The effects are counted exactly:
// over pgx the guard refuses the statements sent after the end in a
// statement of their own; one simple-protocol statement that ends the
// transaction and writes ("ROLLBACK; INSERT ...") writes outside it on every
// driver, and so does a *sql.Tx's statement after the end. Before, over pgx
// (and for a transaction begun again, on every driver), such a handling was
// OutcomeRetry and the redelivery ran the effect a second time.
func TestHandlerThatEndsItsTransaction(t *testing.T) {
	t.Run("pgx", func(t *testing.T) { t.Parallel(); endsItsTransaction(t, pgxKit, true) })
	t.Run("database-sql-pgx-stdlib", func(t *testing.T) { t.Parallel(); endsItsTransaction(t, sqlKit("pgx"), false) })
	t.Run("database-sql-lib-pq", func(t *testing.T) { t.Parallel(); endsItsTransaction(t, sqlKit("postgres"), false) })
}

// endCase is a handler's statements, one string each, with %s for an
// INSERT of the message's effect (fill), and the effects that commit, over
// pgx (guarded) and over database/sql (unguarded).
type endCase struct {
	name               string
	stmts              []string
	guarded, unguarded int
}

var endCases = []endCase{
	{"InsertThenRollbackInOneStatement", []string{"%s; ROLLBACK"}, 0, 0},
	{"RollbackThenInsert", []string{"ROLLBACK", "%s"}, 0, 1},
	{"RollbackAndBeginThenInsert", []string{"ROLLBACK; BEGIN", "%s"}, 0, 0},
	{"RollbackBeginInsertOneByOne", []string{"ROLLBACK", "BEGIN", "%s"}, 0, 0},
	{"InsertRollbackAndBeginInsert", []string{"%s", "ROLLBACK; BEGIN", "%s"}, 0, 0},
	{"RollbackThenInsertInOneStatement", []string{"ROLLBACK; %s"}, 1, 1},
	{"RollbackBeginInsertCommitBeginInOneStatement", []string{"ROLLBACK; BEGIN; %s; COMMIT; BEGIN"}, 1, 1},
}

// fill puts insert in place of the %s of a statement of an endCase.
func fill(stmt, insert string) string {
	if strings.Contains(stmt, "%s") {
		return fmt.Sprintf(stmt, insert)
	}
	return stmt
}

func endsItsTransaction[TTx any](t *testing.T, k kit[TTx], guarded bool) {
	for _, ec := range endCases {
		t.Run(ec.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, k)
			inbox := b.newInbox(t, b.inbox, dedupe.Config{})
			const key = "end-1"
			insert := fmt.Sprintf(`INSERT INTO effects (key) VALUES ('%s')`, key)
			var runs atomic.Int64
			c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{Scope: "orders", Key: func(m string) (string, error) { return m, nil }},
				func(ctx context.Context, tx TTx, _ string) error {
					runs.Add(1)
					for _, s := range ec.stmts {
						if err := k.exec(ctx, tx, fill(s, insert)); err != nil {
							return err // pgx's guard refuses what follows the end
						}
					}
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			out, err := c.Handle(ctx, key)
			if out != dedupe.OutcomePoisoned || !errors.Is(err, dedupe.ErrTxEnded) || !errors.Is(err, dedupe.ErrPoisoned) {
				t.Fatalf("handle = %v, %v; want poisoned with ErrTxEnded: a handler that ended its transaction is never reported processed, nor run again", out, err)
			}
			if !strings.Contains(err.Error(), "handler ended") {
				t.Fatalf("error %q does not say that the handler ended the transaction itself", err)
			}
			want := ec.unguarded
			if guarded {
				want = ec.guarded
			}
			if got := b.effects(t, key); got != want {
				t.Fatalf("effects = %d after the first copy, want %d", got, want)
			}
			// The redeliveries, several at once: settled failures.
			const copies = 6
			var wrong atomic.Int64
			dbtest.Together(copies, func(int) {
				if out, err := c.Handle(ctx, key); out != dedupe.OutcomePoisoned || !errors.Is(err, dedupe.ErrPoisoned) {
					wrong.Add(1)
					t.Errorf("redelivery = %v, %v; want poisoned", out, err)
				}
			})
			if wrong.Load() != 0 {
				t.FailNow()
			}
			if got := runs.Load(); got != 1 {
				t.Fatalf("handler ran %d times, want once", got)
			}
			if got := b.effects(t, key); got != want {
				t.Fatalf("effects = %d after %d redeliveries, want %d", got, copies, want)
			}
			rec, err := inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: key})
			if err != nil || rec.State != dedupe.StateFailed || rec.Attempts != 1 || !strings.Contains(rec.LastError, "handler ended") {
				t.Fatalf("record = %+v, %v; want the key failed after 1 attempt, its error saying why", rec, err)
			}
		})
	}
}
