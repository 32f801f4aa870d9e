package dedupe

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/txguard"
)

// guardedTx is the transaction a handler receives: the claim's own, whose
// end belongs to dedupe (internal/txguard, shared with httpidem). Commit and
// Rollback are refused with ErrTxOwned (the handler returns nil to commit,
// an error to roll back), and once the transaction was ended behind
// dedupe's back (a COMMIT or ROLLBACK sent as a statement, or through
// Conn()) every further statement is refused with ErrTxEnded instead of
// running outside any transaction. Begin opens a savepoint as pgx does; the
// handler may commit or roll back that. No check costs a round trip.
type guardedTx = txguard.Tx

// errStatementRefused is the guard's refusal of a statement after the end.
var errStatementRefused = fmt.Errorf("%w: statement refused", ErrTxEnded)

// newGuard wraps tx, the claim's transaction.
func newGuard(tx pgx.Tx) *guardedTx { return txguard.New(tx, ErrTxOwned, errStatementRefused) }

// checkGuard is run after the handler returned nil: the transaction must
// still be open and healthy, or nothing may be reported as processed.
func checkGuard(g txConn) error {
	switch g.status() {
	case 'T':
		return nil
	case 'E':
		return fmt.Errorf("%w: a statement failed and the handler returned nil", ErrTxEnded)
	default:
		return fmt.Errorf("%w: the transaction is no longer open", ErrTxEnded)
	}
}
