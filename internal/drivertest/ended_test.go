package drivertest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/exactlyonce/dedupe"
)

// TestHandlerThatEndsItsTransaction: a handler that ends the claim's
// transaction with a statement (ROLLBACK, then perhaps BEGIN, with writes
// before or after) and returns nil is never reported processed, on every
// driver: Handle returns ErrTxEnded, and over two copies of the message the
// effect commits at most once. Over pgx the guard refuses the statements
// after the end; over database/sql, whose *sql.Tx cannot be guarded, the
// COMMIT proves that the transaction still holds the claim (the savepoint
// taken after it). A transaction found with none open at its end over
// database/sql may have run the handler's later statements on their own
// (each committing): its key is marked failed, so that they never run
// again; a transaction begun again by the handler is rolled back and
// retried.
func TestHandlerThatEndsItsTransaction(t *testing.T) {
	t.Run("pgx", func(t *testing.T) { t.Parallel(); endsItsTransaction(t, pgxKit) })
	t.Run("database-sql-pgx-stdlib", func(t *testing.T) { t.Parallel(); endsItsTransaction(t, sqlKit("pgx")) })
	t.Run("database-sql-lib-pq", func(t *testing.T) { t.Parallel(); endsItsTransaction(t, sqlKit("postgres")) })
}

// endCase is a handler's statements, one string each, with %s for an
// INSERT of the message's effect.
type endCase struct {
	name  string
	stmts []string
}

var endCases = []endCase{
	{"InsertThenRollbackInOneStatement", []string{"%s; ROLLBACK"}},
	{"RollbackThenInsert", []string{"ROLLBACK", "%s"}},
	{"RollbackAndBeginThenInsert", []string{"ROLLBACK; BEGIN", "%s"}},
	{"RollbackBeginInsertOneByOne", []string{"ROLLBACK", "BEGIN", "%s"}},
	{"InsertRollbackAndBeginInsert", []string{"%s", "ROLLBACK; BEGIN", "%s"}},
}

func endsItsTransaction[TTx any](t *testing.T, k kit[TTx]) {
	for _, ec := range endCases {
		t.Run(ec.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, k)
			inbox := b.newInbox(t, b.inbox, dedupe.Config{})
			const key = "end-1"
			insert := fmt.Sprintf(`INSERT INTO effects (key) VALUES ('%s')`, key)
			c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{Scope: "orders", Key: func(m string) (string, error) { return m, nil }},
				func(ctx context.Context, tx TTx, _ string) error {
					for _, s := range ec.stmts {
						if s == "%s" || len(s) > 2 && s[:2] == "%s" {
							s = fmt.Sprintf(s, insert)
						}
						if err := k.exec(ctx, tx, s); err != nil {
							return err // pgx's guard refuses what follows the end
						}
					}
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for copyN := 1; copyN <= 2; copyN++ {
				out, err := c.Handle(ctx, key)
				if out == dedupe.OutcomeClaimed || out == dedupe.OutcomeDuplicate || err == nil {
					t.Fatalf("copy %d: handle = %v, %v; a handler that ended its transaction must never be reported processed", copyN, out, err)
				}
				if out != dedupe.OutcomeRetry && out != dedupe.OutcomePoisoned {
					t.Fatalf("copy %d: outcome %v (%v), want retry or poisoned", copyN, out, err)
				}
				if copyN == 1 && !errors.Is(err, dedupe.ErrTxEnded) {
					t.Fatalf("copy 1: error %v, want ErrTxEnded", err)
				}
				if out == dedupe.OutcomePoisoned && !errors.Is(err, dedupe.ErrPoisoned) {
					t.Fatalf("copy %d: poisoned with %v, want ErrPoisoned", copyN, err)
				}
			}
			if got := b.effects(t, key); got > 1 {
				t.Fatalf("effects = %d over two copies; want at most 1", got)
			}
			rec, err := inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: key})
			if err != nil {
				t.Fatalf("lookup: %v; want the failed attempts recorded", err)
			}
			if rec.State == dedupe.StateComplete {
				t.Fatalf("key state %s; want in flight or failed", rec.State)
			}
		})
	}
}
