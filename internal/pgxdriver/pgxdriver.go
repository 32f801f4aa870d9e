// Package pgxdriver is the core's driver of a pgx pool or connection
// (internal/driver): BEGIN and the statements behind it in one round trip,
// the handler's transaction guarded (internal/txguard), and a Consumer's
// claim round sent straight over pgconn where the pool or connection
// allows it (internal/direct).
package pgxdriver

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/driver"
	"github.com/exactlyonce/dedupe/internal/txguard"
)

// DB is a pgx pool or connection (*pgxpool.Pool, *pgx.Conn).
type DB interface {
	driver.Querier
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Driver is the driver of a pgx pool or connection.
type Driver struct {
	DB
	// owned and refused are the guard's refusals (New).
	owned, refused error
	// direct, when not nil, sends a Consumer's claim round straight over
	// pgconn (ClaimDirect).
	direct *direct.Sender
	// directOff is set once a connection's own configuration refused the
	// round (a BeforeConnect hook that sets a tracer or another statement
	// mode): the pool's connections are made alike, so its claims go
	// through pgx's batch from then on.
	directOff atomic.Bool
}

// New returns the driver of db. The handler's transaction refuses Commit
// and Rollback with owned, and every statement after its end with refused
// (internal/txguard).
func New(db DB, owned, refused error) *Driver {
	return &Driver{DB: db, owned: owned, refused: refused, direct: direct.NewSender(db)}
}

var txType = reflect.TypeFor[pgx.Tx]()

// TxType is pgx.Tx.
func (d *Driver) TxType() reflect.Type { return txType }

// Pipelines is true: a batch always goes in one round trip.
func (d *Driver) Pipelines() bool { return true }

// ListenPool is the pool, or nil for a connection.
func (d *Driver) ListenPool() *pgxpool.Pool {
	p, _ := d.DB.(*pgxpool.Pool)
	return p
}

// NewBatch returns a batch that begins with BEGIN.
func (d *Driver) NewBatch(opts pgx.TxOptions) *pgx.Batch {
	b := &pgx.Batch{}
	b.BeginTx(opts)
	return b
}

// Begin begins a transaction and runs b's statements in it, with BEGIN (b
// from NewBatch) in one round trip.
func (d *Driver) Begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (driver.Tx, error) {
	if b == nil {
		tx, err := d.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		return d.Guard(tx), nil
	}
	br := d.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return d.Guard(tx), nil
}

// Guard returns tx, the claim's transaction, as the core's Tx: its handler
// receives it guarded.
func (d *Driver) Guard(tx pgx.Tx) *Tx { return (*Tx)(txguard.New(tx, d.owned, d.refused)) }

// Tx is a pgx transaction as the core uses it: the guard the handler
// receives (internal/txguard), seen without the guard's methods, so that
// the core's own statements, Commit and Rollback reach the transaction
// itself (the embedded pgx.Tx) in the same allocation.
type Tx txguard.Tx

// HandlerTx is the guarded transaction.
func (t *Tx) HandlerTx() any { return (*txguard.Tx)(t) }

// Status is the connection's transaction status.
func (t *Tx) Status() byte { return (*txguard.Tx)(t).Status() }

// Ended reports whether the handler ended the transaction.
func (t *Tx) Ended() bool { return (*txguard.Tx)(t).Ended() }

// CommitClaim is Commit: a Consumer's transaction is begun with the checked
// COMMIT as its CommitQuery.
func (t *Tx) CommitClaim(ctx context.Context) error { return t.Commit(ctx) }

// Direct reports whether a Consumer's claim may go in the direct round.
func (d *Driver) Direct() bool { return d.direct != nil && !d.directOff.Load() }

// ClaimDirect begins a transaction on a connection of d and runs claim, the
// direct round with begin's BEGIN, on it (direct.Sender.Round; stmts are the
// round's statements, prepared anew when one went stale). It returns
// direct.ErrNoDirect, having sent nothing, when the connection's own
// configuration refuses the round (logged on log the first time: claims go
// through pgx's batch from then on, Direct), or direct.ErrTypes, having
// rolled back what it sent, when the round must go through pgx instead.
func (d *Driver) ClaimDirect(ctx context.Context, log *slog.Logger, stmts *direct.Stmts, begin *direct.Begin, claim direct.ClaimFunc) (driver.Tx, error) {
	tx, err := d.direct.Round(ctx, stmts, begin, claim)
	if err != nil {
		if errors.Is(err, direct.ErrNoDirect) && d.directOff.CompareAndSwap(false, true) {
			log.DebugContext(ctx, "dedupe: the pool's connections are configured for pgx's batch (a tracer or another statement mode); claims go through it")
		}
		return nil, err
	}
	return d.Guard(tx), nil
}
