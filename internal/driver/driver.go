// Package driver is the seam between the core (the root package) and a
// database client library: the core builds every statement (its SQL lives
// in the root's sql.go) and runs it through a Querier; a Driver adds only
// what a Querier cannot say: how a transaction begins with statements
// queued behind BEGIN, what the handler receives as its transaction, and
// whether LISTEN is available. internal/pgxdriver is the default;
// internal/sqldriver serves database/sql (the root's SQL).
//
// It imports nothing of the module but the root's other internal packages,
// and knows nothing of inboxes, keys or outcomes.
package driver

import (
	"context"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier is what runs a statement: dedupe.Querier.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Driver is one database handle (a pgx pool or connection, a database/sql
// handle) as the core uses it.
type Driver interface {
	Querier
	// NewBatch returns the batch that Begin takes for a transaction with
	// opts: pgx queues its BEGIN first, so that no copy is needed.
	NewBatch(opts pgx.TxOptions) *pgx.Batch
	// Begin begins a transaction with opts and runs b's statements in it
	// (b from NewBatch(opts), or nil). pgx sends BEGIN and b in one round
	// trip; database/sql sends BEGIN alone, then b in one round trip over
	// pgx's stdlib, or one statement after the other over other drivers
	// (the callbacks queued in b tell which by the row they get:
	// pgbatch.SkipRow). On error, and when a statement's callback panics,
	// nothing stays open.
	Begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (Tx, error)
	// Pipelines reports whether statements queued in a batch are always
	// sent together (pgx), or possibly one by one (database/sql).
	Pipelines() bool
	// TxType is the type of transaction this driver's handlers receive.
	TxType() reflect.Type
	// ListenPool is the pool whose configuration LISTEN connections copy,
	// nil when the driver cannot LISTEN.
	ListenPool() *pgxpool.Pool
}

// Tx is a transaction begun by a Driver.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
	// HandlerTx is what a handler receives: a guarded pgx.Tx, or *sql.Tx.
	HandlerTx() any
	// Status is 'T' in a transaction, 'E' in a failed one, 'I' after its
	// end, as far as the driver can tell without a round trip.
	Status() byte
	// Ended reports whether the handler ended the transaction itself.
	Ended() bool
	// CommitClaim commits a Consumer's transaction only if it still holds
	// the claim, in the round trip of COMMIT alone where the driver can.
	CommitClaim(ctx context.Context) error
}
