package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/dedupe/internal/pgerr"
)

// ErrNoTx is a transaction found with none open at its COMMIT: ended behind
// its owner's back.
var ErrNoTx = errors.New("no transaction is open")

// BadConnTries is how often beginTx takes a connection of its own when BEGIN
// finds it broken (driver.ErrBadConn), as (*sql.DB).BeginTx does: a
// *sql.Conn's BeginTx does not try another connection by itself.
const BadConnTries = 3

// Begin begins a transaction of db's into t, on a connection of its own
// (kept in t until the transaction ends) when onConn.
func Begin(ctx context.Context, db *sql.DB, so *sql.TxOptions, onConn bool, t *Tx) error {
	if !onConn {
		tx, err := db.BeginTx(ctx, so)
		if err != nil {
			return err
		}
		*t = Tx{Querier: Querier{R: tx}, SQL: tx}
		return nil
	}
	for try := 1; ; try++ {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		tx, err := conn.BeginTx(ctx, so)
		if err == nil {
			*t = Tx{Querier: Querier{R: tx}, SQL: tx, Conn: conn}
			return nil
		}
		_ = conn.Close() // database/sql discards a bad connection itself
		if !errors.Is(err, driver.ErrBadConn) || try == BadConnTries {
			return err
		}
	}
}

// PgxConner is a database/sql driver connection of pgx's stdlib, which
// hands out the *pgx.Conn under it.
type PgxConner interface{ Conn() *pgx.Conn }

// ErrNotPgx is a driver connection that is not a PgxConner.
var ErrNotPgx = errors.New("dedupe: not a pgx stdlib connection")

// SendPipelined sends b's statements in one round trip through the *pgx.Conn
// under t's connection, as the pgx driver does behind BEGIN; the handler's
// *sql.Tx then goes on on that connection. ErrNotPgx, remembered in notPgx,
// when the driver is not pgx's stdlib.
func SendPipelined(ctx context.Context, t *Tx, notPgx *atomic.Bool, b *pgx.Batch) error {
	return RawPgx(t, notPgx, func(conn *pgx.Conn) error { return conn.SendBatch(ctx, b).Close() })
}

// RawPgx runs f with the *pgx.Conn under t's connection: ErrNotPgx,
// remembered in notPgx, when the driver is not pgx's stdlib.
//
// (*sql.Conn).Raw closes its connection when its function panics or returns
// driver.ErrBadConn, which waits for t to end: a hang. So the function does
// neither; a panic is carried out of Raw and raised again after it.
func RawPgx(t *Tx, notPgx *atomic.Bool, f func(conn *pgx.Conn) error) error {
	var panicked any
	err := t.Conn.Raw(func(dc any) (err error) {
		pc, ok := dc.(PgxConner)
		if !ok {
			notPgx.Store(true)
			return ErrNotPgx
		}
		defer func() {
			if v := recover(); v != nil {
				panicked, err = v, errors.New("dedupe: panic behind BEGIN")
			}
			if errors.Is(err, driver.ErrBadConn) {
				err = fmt.Errorf("dedupe: %v", err) // not %w: see above
			}
		}()
		return f(pc.Conn())
	})
	if panicked != nil {
		panic(panicked)
	}
	return err
}

// Tx is a database/sql transaction; its handler receives the *sql.Tx.
type Tx struct {
	Querier
	SQL  *sql.Tx
	Conn *sql.Conn // the connection SQL holds, when begun on one of its own (Begin)
}

// SetDeferrable makes t DEFERRABLE if opts say so (database/sql has no
// option for it); on error t is rolled back.
func (t *Tx) SetDeferrable(ctx context.Context, opts pgx.TxOptions) error {
	if opts.DeferrableMode != pgx.Deferrable {
		return nil
	}
	if _, err := t.Exec(ctx, "SET TRANSACTION DEFERRABLE"); err != nil {
		_ = t.Rollback(ctx)
		return err
	}
	return nil
}

// Commit commits t and gives its connection back.
func (t *Tx) Commit(context.Context) error { return t.release(t.SQL.Commit()) }

// Rollback rolls t back and gives its connection back.
func (t *Tx) Rollback(context.Context) error { return t.release(t.SQL.Rollback()) }

// release returns the connection t was begun on to the pool, once t ended
// (a *sql.Conn cannot close while its transaction is open).
func (t *Tx) release(err error) error {
	if t.Conn != nil {
		_ = t.Conn.Close()
	}
	return err
}

// CommitClaim commits a Consumer's transaction only if it still holds the
// claim (commitSQL): a handler's *sql.Tx cannot be guarded, so a
// transaction it ended itself (and perhaps began again) shows here, before
// anything is reported processed.
//
// Over pgx's stdlib the check and COMMIT go in one simple query on the
// *pgx.Conn under the transaction, as COMMIT alone would: no round trip
// more. database/sql must still end its *sql.Tx, whose COMMIT pgx would
// send again; the connection is held busy (an empty pgconn pipeline) while
// it does, so that pgx refuses that COMMIT without sending it, and the
// transaction it refers to is already over. Over other drivers (lib/pq)
// the check goes first, on its own, then the driver's COMMIT: one round
// trip more (a lib/pq connection on which COMMIT was sent as a statement is
// marked bad by its own Commit).
//
// commitSQL is the check and COMMIT as one simple query, checkSQL the check
// alone. A transaction found with none open returns ErrNoTx.
func (t *Tx) CommitClaim(ctx context.Context, commitSQL, checkSQL string) error {
	if t.Conn != nil {
		done, err := t.commitRaw(ctx, commitSQL)
		if done {
			return err
		}
	}
	if _, err := t.Exec(ctx, checkSQL); err != nil {
		if code, ok := pgerr.SQLState(err); ok && code == pgerr.InFailedTx {
			// A statement of the handler failed: the driver's COMMIT says
			// so as it always did (a failed-transaction commit).
			return t.Commit(ctx)
		}
		_ = t.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return t.Commit(ctx)
}

// commitRaw is CommitClaim over pgx's stdlib. done is false, with nothing
// sent, when the connection is not pgx's stdlib's or its transaction failed
// (the driver's COMMIT then reports the failed transaction as before).
func (t *Tx) commitRaw(ctx context.Context, commitSQL string) (done bool, err error) {
	var (
		status byte
		busy   *pgconn.Pipeline
		cerr   error
	)
	rerr := t.Conn.Raw(func(dc any) error {
		pc, ok := dc.(PgxConner)
		if !ok {
			return ErrNotPgx
		}
		c := pc.Conn().PgConn()
		if status = c.TxStatus(); status != 'T' {
			return nil
		}
		// Not cancelled with ctx, as database/sql's own COMMIT is not: an
		// interrupted COMMIT is one more outcome to resolve.
		mrr := c.Exec(context.WithoutCancel(ctx), commitSQL)
		for mrr.NextResult() {
			_, _ = mrr.ResultReader().Close()
		}
		if cerr = mrr.Close(); cerr == nil && c.TxStatus() == 'I' {
			busy = c.StartPipeline(context.Background())
		}
		return nil
	})
	switch {
	case errors.Is(rerr, ErrNotPgx):
		return false, nil
	case rerr != nil:
		return true, rerr
	case status == 'E':
		return false, nil
	case status != 'T':
		_ = t.Rollback(context.WithoutCancel(ctx))
		return true, ErrNoTx
	}
	if busy == nil {
		// The check or the COMMIT failed: nothing committed, or the
		// connection broke and the outcome is the caller's to resolve.
		_ = t.Rollback(context.WithoutCancel(ctx))
		return true, cerr
	}
	_ = t.SQL.Commit() // refused by pgx without a round trip: the connection is busy
	_ = t.Conn.Raw(func(any) error {
		_ = busy.Close()
		return nil
	})
	_ = t.Conn.Close()
	return true, nil
}
