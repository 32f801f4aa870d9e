package httpidem

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/txguard"
)

// The guard's refusals: each matches the httpidem sentinel and the core's.
var (
	errTxOwned = fmt.Errorf("%w (%w)", ErrTxManaged, dedupe.ErrTxOwned)
	errTxEnded = fmt.Errorf("%w: statement refused (%w)", ErrTxEnded, dedupe.ErrTxEnded)
)

// guardedTx is the request transaction as the handler sees it through Tx:
// its end belongs to the middleware (the core's guard, internal/txguard).
// Commit and Rollback are refused, and once the transaction was ended
// behind the middleware's back (a COMMIT or ROLLBACK sent as a statement,
// or through Conn()) every further statement is refused instead of running
// outside any transaction, where it would commit on its own, whatever the
// request's answer. Begin opens a savepoint, which the handler may commit
// or roll back. End marks it ended by the middleware, so that a handler
// that kept it cannot reach a connection that serves another request.
type guardedTx = txguard.Tx

func newGuard(tx pgx.Tx) *guardedTx { return txguard.New(tx, errTxOwned, errTxEnded) }
