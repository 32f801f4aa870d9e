// Package corelink lends the packages beside the root (the outbox) the few
// things the root package keeps unexported: its database drivers, its error
// translation and its key rules, so that they exist once. The root package
// fills the variables in when it is initialised (corelink.go in the root);
// a package that imports the root, as the outbox does, finds them set.
//
// It imports nothing of the module, so the root can import it: the arrow
// runs from the outbox to the root, never back.
package corelink

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx is a transaction begun by a Driver: dedupe.Querier with its end.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Driver is the root's driver of one dedupe.DB, as the outbox uses it.
type Driver interface {
	// NewBatch returns the batch that Begin takes for a transaction with
	// opts (pgx queues its BEGIN first).
	NewBatch(opts pgx.TxOptions) *pgx.Batch
	// Begin begins a transaction with opts and runs b's statements in it:
	// pgx sends BEGIN and b in one round trip; database/sql sends BEGIN,
	// then b. On error nothing stays open.
	Begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (Tx, error)
	// ListenPool is the pool whose configuration LISTEN connections copy,
	// nil when the driver cannot LISTEN.
	ListenPool() *pgxpool.Pool
}

// Set by the root package at initialisation.
var (
	// NewDriver returns the driver of db (a dedupe.DB), or the root's
	// *ConfigError when db is nil or of no known kind.
	NewDriver func(db any) (Driver, error)
	// Translate maps a database error to the root's sentinel errors
	// (ErrNotMigrated, ErrInFlight, ErrRetryable, ErrTxEnded), wrapping it.
	Translate func(err error) error
	// ValidatePart checks one part of a key (or an outbox message's ID,
	// topic or key) with the rules of dedupe.Key.Validate; it returns a
	// *dedupe.KeyError naming field.
	ValidatePart func(field, v string) error
)
