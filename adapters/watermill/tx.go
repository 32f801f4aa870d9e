package dedupewatermill

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// txKey holds the handling's transaction in a context.
type txKey struct{}

// Tx returns the transaction of the handling whose context ctx is (the
// message's context inside a handler the Middleware runs): a pgx.Tx for an
// inbox over a pgx pool, a *sql.Tx for an inbox over dedupe.SQL. ok is false
// outside such a handling, or for the other type. Write the handler's
// effects through it; do not commit or roll it back.
func Tx[TTx any](ctx context.Context) (tx TTx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(TTx)
	return tx, ok
}

// querier returns tx as what outbox.Outbox.Enqueue writes through.
func querier(tx any) (dedupe.Querier, error) {
	switch t := tx.(type) {
	case pgx.Tx:
		return t, nil
	case *sql.Tx:
		return dedupe.SQLTx(t), nil
	}
	return nil, fmt.Errorf("dedupewatermill: transaction of type %T", tx)
}
