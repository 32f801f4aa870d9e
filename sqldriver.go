package dedupe

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/sqlconv"
	"github.com/exactlyonce/dedupe/internal/txopts"
)

// SQL wraps a database/sql handle to PostgreSQL (over pgx's stdlib, lib/pq or
// any driver that speaks PostgreSQL's SQL) as the DB of an Inbox or an outbox.Outbox,
// for applications built on database/sql (GORM, Bun, sqlx, sqlc): handlers
// then receive a *sql.Tx (see TxHandlerFunc), and the guarantees are the
// same as with pgx.
//
// What database/sql cannot do costs round trips, never correctness. BEGIN
// goes alone. Over pgx's stdlib the claim and the savepoint follow in one
// round trip, through the *pgx.Conn under the transaction; over other
// drivers (lib/pq, or pgx's stdlib wrapped by another driver) one after the
// other, each only when needed. Over pgx's stdlib the read of an existing key
// is placed as over pgx: with the claim while the inbox's recent claims met
// duplicates, else only after a claim that found its key taken; over other
// drivers it follows only such a claim. The outbox.Relay cannot LISTEN, so it polls
// (outbox.RelayConfig.PollInterval). A handler's *sql.Tx cannot be guarded, but
// its COMMIT proves that it still holds the claim: a handler that commits
// or rolls back itself (and perhaps begins again) gets ErrTxEnded from
// Handle, nothing is reported processed, and its effects commit at most
// once (Handle says how). Over pgx's stdlib the proof costs no round trip;
// over other drivers one.
func SQL(db *sql.DB) *SQLDB { return &SQLDB{sqlQuerier: sqlQuerier{db}, db: db} }

// SQLTx wraps a database/sql transaction for the calls that join the
// caller's transaction: Inbox.Claim, ClaimBatch, StoreResultTx, CompleteTx
// and outbox.Outbox.Enqueue.
func SQLTx(tx *sql.Tx) Querier { return sqlQuerier{tx} }

// SQLDB is a database/sql handle as a DB: the database/sql driver. Build it
// with SQL.
type SQLDB struct {
	sqlQuerier
	db *sql.DB
	// notPgx is set once a connection of db showed not to be pgx's
	// stdlib's: statements behind BEGIN then go one by one, on any
	// connection.
	notPgx atomic.Bool
	// noDirect is set once a pgx stdlib connection of db refused the
	// direct claim round (its configuration wants pgx's batch): claims go
	// through begin from then on (SQLDB.claimDirect).
	noDirect atomic.Bool
}

// DB returns the wrapped handle, for packages built on the inbox that run
// transactions of their own (httpidem).
func (d *SQLDB) DB() *sql.DB { return d.db }

var sqlTxType = reflect.TypeFor[*sql.Tx]()

func (d *SQLDB) txType() reflect.Type      { return sqlTxType }
func (d *SQLDB) pipelines() bool           { return false }
func (d *SQLDB) listenPool() *pgxpool.Pool { return nil }

func (d *SQLDB) newBatch(pgx.TxOptions) *pgx.Batch { return &pgx.Batch{} }

// begin begins a transaction and runs b's statements in it. Until db's
// driver showed not to be pgx's stdlib, the transaction runs on a connection
// of its own, so that b can go through the *pgx.Conn under it in one round
// trip (sendPipelined); otherwise b's statements go one by one.
func (d *SQLDB) begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (txConn, error) {
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
	if err := t.setDeferrable(ctx, opts); err != nil {
		return nil, err
	}
	if b == nil {
		return t, nil
	}
	err = errNotPgx
	if pipelined {
		err = d.sendPipelined(ctx, t, b)
	}
	if errors.Is(err, errNotPgx) {
		err = sendBatch(ctx, t, b)
	}
	if err != nil {
		_ = t.Rollback(ctx)
		return nil, err
	}
	return t, nil
}

// badConnTries is how often beginTx takes a connection of its own when BEGIN
// finds it broken (driver.ErrBadConn), as (*sql.DB).BeginTx does: a
// *sql.Conn's BeginTx does not try another connection by itself.
const badConnTries = 3

// beginTx begins a transaction of db's, on a connection of its own (kept in
// the sqlTx until the transaction ends) when onConn.
func (d *SQLDB) beginTx(ctx context.Context, so *sql.TxOptions, onConn bool) (*sqlTx, error) {
	if !onConn {
		tx, err := d.db.BeginTx(ctx, so)
		if err != nil {
			return nil, err
		}
		return &sqlTx{sqlQuerier: sqlQuerier{tx}, tx: tx}, nil
	}
	for try := 1; ; try++ {
		conn, err := d.db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		tx, err := conn.BeginTx(ctx, so)
		if err == nil {
			return &sqlTx{sqlQuerier: sqlQuerier{tx}, tx: tx, conn: conn}, nil
		}
		_ = conn.Close() // database/sql discards a bad connection itself
		if !errors.Is(err, sqldriver.ErrBadConn) || try == badConnTries {
			return nil, err
		}
	}
}

// pgxConner is a database/sql driver connection of pgx's stdlib, which
// hands out the *pgx.Conn under it.
type pgxConner interface{ Conn() *pgx.Conn }

// errNotPgx is a driver connection that is not a pgxConner.
var errNotPgx = errors.New("dedupe: not a pgx stdlib connection")

// sendPipelined sends b's statements in one round trip through the *pgx.Conn
// under t's connection, as the pgx driver does behind BEGIN; the handler's
// *sql.Tx then goes on on that connection. errNotPgx, remembered in d, when
// the driver is not pgx's stdlib.
func (d *SQLDB) sendPipelined(ctx context.Context, t *sqlTx, b *pgx.Batch) error {
	return d.rawPgx(t, func(conn *pgx.Conn) error { return conn.SendBatch(ctx, b).Close() })
}

// rawPgx runs f with the *pgx.Conn under t's connection: errNotPgx,
// remembered in d, when the driver is not pgx's stdlib.
//
// (*sql.Conn).Raw closes its connection when its function panics or returns
// driver.ErrBadConn, which waits for t to end: a hang. So the function does
// neither; a panic is carried out of Raw and raised again after it.
func (d *SQLDB) rawPgx(t *sqlTx, f func(conn *pgx.Conn) error) error {
	var panicked any
	err := t.conn.Raw(func(dc any) (err error) {
		pc, ok := dc.(pgxConner)
		if !ok {
			d.notPgx.Store(true)
			return errNotPgx
		}
		defer func() {
			if v := recover(); v != nil {
				panicked, err = v, errors.New("dedupe: panic behind BEGIN")
			}
			if errors.Is(err, sqldriver.ErrBadConn) {
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

// sqlTx is a database/sql transaction; its handler receives the *sql.Tx.
type sqlTx struct {
	sqlQuerier
	tx   *sql.Tx
	conn *sql.Conn // the connection tx holds, when begun on one of its own (beginTx)
}

// setDeferrable makes t DEFERRABLE if opts say so (database/sql has no
// option for it); on error t is rolled back.
func (t *sqlTx) setDeferrable(ctx context.Context, opts pgx.TxOptions) error {
	if opts.DeferrableMode != pgx.Deferrable {
		return nil
	}
	if _, err := t.Exec(ctx, "SET TRANSACTION DEFERRABLE"); err != nil {
		_ = t.Rollback(ctx)
		return err
	}
	return nil
}

func (t *sqlTx) Commit(context.Context) error { return t.release(t.tx.Commit()) }

func (t *sqlTx) Rollback(context.Context) error { return t.release(t.tx.Rollback()) }

// release returns the connection t was begun on to the pool, once t ended
// (a *sql.Conn cannot close while its transaction is open).
func (t *sqlTx) release(err error) error {
	if t.conn != nil {
		_ = t.conn.Close()
	}
	return err
}
func (t *sqlTx) handlerTx() any { return t.tx }

// status cannot be read without a round trip: an ended or failed
// transaction shows when the next statement or the COMMIT is refused.
func (t *sqlTx) status() byte { return 'T' }

// ended cannot be known in advance either: the next statement is refused
// with sql.ErrTxDone (isTxDone), and the caller then acts as if it knew.
func (t *sqlTx) ended() bool { return false }

// sqlQuerier runs the core's statements through database/sql, with the
// conversions of internal/sqlconv.
type sqlQuerier struct{ r sqlconv.Runner }

// Exec runs a statement.
func (q sqlQuerier) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	return sqlconv.Querier{R: q.r}.Exec(ctx, query, args...)
}

// Query runs a query; its rows read intervals as durations.
func (q sqlQuerier) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	return sqlconv.Querier{R: q.r}.Query(ctx, query, args...)
}

// QueryRow runs a query for one row; no row is pgx.ErrNoRows (and
// sql.ErrNoRows).
func (q sqlQuerier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return sqlconv.Querier{R: q.r}.QueryRow(ctx, query, args...)
}

// commitClaim commits a Consumer's transaction only if it still holds the
// claim (sqlCommitClaim): a handler's *sql.Tx cannot be guarded, so a
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
func (t *sqlTx) commitClaim(ctx context.Context) error {
	if t.conn != nil {
		done, err := t.commitRaw(ctx)
		if done {
			return err
		}
	}
	if _, err := t.Exec(ctx, sqlCheckClaim); err != nil {
		if code, ok := sqlState(err); ok && code == pgInFailedTx {
			// A statement of the handler failed: the driver's COMMIT says
			// so as it always did (a failed-transaction commit).
			return t.Commit(ctx)
		}
		_ = t.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return t.Commit(ctx)
}

// commitRaw is commitClaim over pgx's stdlib. done is false, with nothing
// sent, when the connection is not pgx's stdlib's or its transaction failed
// (the driver's COMMIT then reports the failed transaction as before).
func (t *sqlTx) commitRaw(ctx context.Context) (done bool, err error) {
	var (
		status byte
		busy   *pgconn.Pipeline
		cerr   error
	)
	rerr := t.conn.Raw(func(dc any) error {
		pc, ok := dc.(pgxConner)
		if !ok {
			return errNotPgx
		}
		c := pc.Conn().PgConn()
		if status = c.TxStatus(); status != 'T' {
			return nil
		}
		// Not cancelled with ctx, as database/sql's own COMMIT is not: an
		// interrupted COMMIT is one more outcome to resolve.
		mrr := c.Exec(context.WithoutCancel(ctx), sqlCommitClaim)
		for mrr.NextResult() {
			_, _ = mrr.ResultReader().Close()
		}
		if cerr = mrr.Close(); cerr == nil && c.TxStatus() == 'I' {
			busy = c.StartPipeline(context.Background())
		}
		return nil
	})
	switch {
	case errors.Is(rerr, errNotPgx):
		return false, nil
	case rerr != nil:
		return true, rerr
	case status == 'E':
		return false, nil
	case status != 'T':
		_ = t.Rollback(context.WithoutCancel(ctx))
		return true, errTxIdle
	}
	if busy == nil {
		// The check or the COMMIT failed: nothing committed, or the
		// connection broke and the outcome is the caller's to resolve.
		_ = t.Rollback(context.WithoutCancel(ctx))
		return true, cerr
	}
	_ = t.tx.Commit() // refused by pgx without a round trip: the connection is busy
	_ = t.conn.Raw(func(any) error {
		_ = busy.Close()
		return nil
	})
	_ = t.conn.Close()
	return true, nil
}

// The direct claim round over database/sql. Over pgx's stdlib a Consumer's
// claim follows BEGIN (which database/sql sends alone) through the
// *pgx.Conn under the *sql.Tx: the lock timeout, the claim and the
// savepoint in one round trip, and the read of an existing key with them or
// after them, sent as the pgx driver's direct round sends them
// (driver.go, sendDirect). Where the connection is not pgx's
// stdlib, or its configuration wants pgx's batch (a tracer, another
// statement mode), the claim goes through SQLDB.begin as before.

// claimDirect begins a transaction of d and claims r in it. It returns
// direct.ErrNoDirect, having claimed nothing, when the claim must go through
// SQLDB.begin instead.
func (d *SQLDB) claimDirect(ctx context.Context, i *Inbox, opts pgx.TxOptions, lockTimeout string, r *claimReq) (txConn, *claimRound, error) {
	args := &direct.Args{}
	args.Encode(i.directParams(r), lockTimeout)
	t, err := d.beginTx(ctx, txopts.SQL(opts), true)
	if err != nil {
		return nil, nil, err
	}
	// A panic goes on to the caller, who has no transaction to roll back.
	defer func() {
		if v := recover(); v != nil {
			_ = t.Rollback(context.WithoutCancel(ctx))
			panic(v)
		}
	}()
	if err := t.setDeferrable(ctx, opts); err != nil {
		return nil, nil, err
	}
	var round *claimRound
	err = d.rawPgx(t, func(conn *pgx.Conn) (err error) {
		st := direct.StateOf(conn)
		if !st.OK() {
			return direct.ErrNoDirect
		}
		round, err = sendDirect(ctx, conn, st, i, nil, args, r)
		if direct.StaleStatement(err) {
			// The transaction is aborted: the statements are prepared anew
			// on this connection by its next round, and the claim runs
			// again in a new transaction.
			st.MarkStale()
			err = wrap(ErrRetryable, err)
		}
		return err
	})
	if err != nil {
		_ = t.Rollback(context.WithoutCancel(ctx))
		switch {
		case errors.Is(err, errNotPgx):
			err = direct.ErrNoDirect
		case errors.Is(err, direct.ErrTypes):
			i.directOff(ctx)
		}
		return nil, nil, err
	}
	return t, round, nil
}
