package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/driver"
	"github.com/exactlyonce/dedupe/internal/pgbatch"
	"github.com/exactlyonce/dedupe/internal/txopts"
)

// Driver is the core's driver of a database/sql handle (internal/driver):
// the root's SQLDB holds one.
type Driver struct {
	Querier
	db *sql.DB
	// commitSQL and checkSQL are the checked COMMIT and its check alone
	// (Tx.CommitClaim); noTx is what CommitClaim returns for a transaction
	// found with none open.
	commitSQL, checkSQL string
	noTx                error
	// notPgx is set once a connection of db showed not to be pgx's
	// stdlib's: statements behind BEGIN then go one by one, on any
	// connection.
	notPgx atomic.Bool
	// noDirect is set once a pgx stdlib connection of db refused the
	// direct claim round (its configuration wants pgx's batch): claims go
	// through Begin from then on (ClaimDirect).
	noDirect atomic.Bool
}

// NewDriver returns the driver of db. commitSQL is the checked COMMIT of a
// Consumer's transaction as one simple query, checkSQL its check alone (see
// Tx.CommitClaim); a transaction found with none open at that COMMIT
// returns noTx.
func NewDriver(db *sql.DB, commitSQL, checkSQL string, noTx error) *Driver {
	return &Driver{Querier: Querier{R: db}, db: db, commitSQL: commitSQL, checkSQL: checkSQL, noTx: noTx}
}

var txType = reflect.TypeFor[*sql.Tx]()

// TxType is *sql.Tx.
func (d *Driver) TxType() reflect.Type { return txType }

// Pipelines is false: behind BEGIN, statements may go one by one.
func (d *Driver) Pipelines() bool { return false }

// ListenPool is nil: database/sql cannot LISTEN.
func (d *Driver) ListenPool() *pgxpool.Pool { return nil }

// NewBatch returns an empty batch: database/sql sends BEGIN alone.
func (d *Driver) NewBatch(pgx.TxOptions) *pgx.Batch { return &pgx.Batch{} }

// Begin begins a transaction and runs b's statements in it. Until db's
// driver showed not to be pgx's stdlib, the transaction runs on a connection
// of its own, so that b can go through the *pgx.Conn under it in one round
// trip (SendPipelined); otherwise b's statements go one by one.
func (d *Driver) Begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (driver.Tx, error) {
	pipelined := b != nil && len(b.QueuedQueries) > 0 && !d.notPgx.Load()
	t, err := d.beginTx(ctx, txopts.SQL(opts), pipelined)
	if err != nil {
		return nil, err
	}
	// A panic in a statement's callback (the core's, or a pgx tracer's)
	// goes on to the caller, who has no transaction to roll back yet.
	defer func() {
		if v := recover(); v != nil {
			_ = t.Rollback(context.WithoutCancel(ctx))
			panic(v)
		}
	}()
	if err := t.SetDeferrable(ctx, opts); err != nil {
		return nil, err
	}
	if b == nil {
		return t, nil
	}
	err = ErrNotPgx
	if pipelined {
		err = SendPipelined(ctx, &t.Tx, &d.notPgx, b)
	}
	if errors.Is(err, ErrNotPgx) {
		err = pgbatch.Send(ctx, t, b)
	}
	if err != nil {
		_ = t.Rollback(ctx)
		return nil, err
	}
	return t, nil
}

// beginTx begins a transaction of db's, on a connection of its own (kept in
// the transaction until it ends) when onConn.
func (d *Driver) beginTx(ctx context.Context, so *sql.TxOptions, onConn bool) (*coreTx, error) {
	t := &coreTx{d: d}
	if err := Begin(ctx, d.db, so, onConn, &t.Tx); err != nil {
		return nil, err
	}
	return t, nil
}

// coreTx is a database/sql transaction as the core's driver.Tx; its
// handler receives the *sql.Tx.
type coreTx struct {
	Tx
	d *Driver
}

func (t *coreTx) HandlerTx() any { return t.SQL }

// Status cannot be read without a round trip: an ended or failed
// transaction shows when the next statement or the COMMIT is refused.
func (t *coreTx) Status() byte { return 'T' }

// Ended cannot be known in advance either: the next statement is refused
// with sql.ErrTxDone, and the caller then acts as if it knew.
func (t *coreTx) Ended() bool { return false }

// CommitClaim commits a Consumer's transaction only if it still holds the
// claim (Tx.CommitClaim says how, per driver).
func (t *coreTx) CommitClaim(ctx context.Context) error {
	err := t.Tx.CommitClaim(ctx, t.d.commitSQL, t.d.checkSQL)
	if errors.Is(err, ErrNoTx) {
		return t.d.noTx
	}
	return err
}

// The direct claim round over database/sql. Over pgx's stdlib a Consumer's
// claim follows BEGIN (which database/sql sends alone) through the
// *pgx.Conn under the *sql.Tx: the lock timeout, the claim and the
// savepoint in one round trip, and the read of an existing key with them or
// after them, sent as the pgx driver's direct round sends them (the root's
// claim round, direct.Claim). Where the connection is not pgx's stdlib, or its
// configuration wants pgx's batch (a tracer, another statement mode), the
// claim goes through Begin as before.

// Direct reports whether a Consumer's claim may go in the direct round:
// until a connection showed not to be pgx's stdlib's, or refused it.
func (d *Driver) Direct() bool { return !d.notPgx.Load() && !d.noDirect.Load() }

// ClaimDirect begins a transaction of d and runs claim, the direct round
// without BEGIN, with the *pgx.Conn under it. It returns
// direct.ErrNoDirect, having claimed nothing, when the connection is not
// pgx's stdlib's or its configuration wants pgx's batch (a tracer, another
// statement mode): the claim must go through Begin instead, and goes there
// from then on (Direct). A statement prepared earlier on the connection
// that went stale (direct.StaleStatement) is prepared anew by its next
// round: the transaction it aborted cannot retry. On any error nothing
// stays open.
func (d *Driver) ClaimDirect(ctx context.Context, opts pgx.TxOptions, claim direct.ClaimFunc) (driver.Tx, error) {
	t, err := d.beginTx(ctx, txopts.SQL(opts), true)
	if err != nil {
		return nil, err
	}
	// A panic goes on to the caller, who has no transaction to roll back.
	defer func() {
		if v := recover(); v != nil {
			_ = t.Rollback(context.WithoutCancel(ctx))
			panic(v)
		}
	}()
	if err := t.SetDeferrable(ctx, opts); err != nil {
		return nil, err
	}
	err = RawPgx(&t.Tx, &d.notPgx, func(conn *pgx.Conn) error {
		st := direct.StateOf(conn)
		if !st.OK() {
			return direct.ErrNoDirect
		}
		err := claim(conn, st, nil)
		if direct.StaleStatement(err) {
			st.MarkStale()
		}
		return err
	})
	if err != nil {
		_ = t.Rollback(context.WithoutCancel(ctx))
		if errors.Is(err, ErrNotPgx) {
			err = direct.ErrNoDirect
		}
		if errors.Is(err, direct.ErrNoDirect) {
			d.noDirect.Store(true)
		}
		return nil, err
	}
	return t, nil
}
