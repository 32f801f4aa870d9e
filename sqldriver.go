package dedupe

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/sqldb"
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
// Handle, nothing is reported processed, its key is marked failed as over
// pgx, and its effects commit at most once (Handle says how). Over pgx's
// stdlib the proof costs no round trip; over other drivers one.
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

// beginTx begins a transaction of db's, on a connection of its own (kept in
// the sqlTx until the transaction ends) when onConn.
func (d *SQLDB) beginTx(ctx context.Context, so *sql.TxOptions, onConn bool) (*sqlTx, error) {
	t := &sqlTx{}
	if err := sqldb.Begin(ctx, d.db, so, onConn, &t.Tx); err != nil {
		return nil, err
	}
	return t, nil
}

// errNotPgx is a driver connection that is not pgx's stdlib's.
var errNotPgx = sqldb.ErrNotPgx

// sendPipelined sends b's statements in one round trip through the *pgx.Conn
// under t's connection (internal/sqldb).
func (d *SQLDB) sendPipelined(ctx context.Context, t *sqlTx, b *pgx.Batch) error {
	return sqldb.SendPipelined(ctx, &t.Tx, &d.notPgx, b)
}

// rawPgx runs f with the *pgx.Conn under t's connection: errNotPgx,
// remembered in d, when the driver is not pgx's stdlib.
func (d *SQLDB) rawPgx(t *sqlTx, f func(conn *pgx.Conn) error) error {
	return sqldb.RawPgx(&t.Tx, &d.notPgx, f)
}

// sqlTx is a database/sql transaction (internal/sqldb) as the core's
// txConn; its handler receives the *sql.Tx.
type sqlTx struct{ sqldb.Tx }

// setDeferrable makes t DEFERRABLE if opts say so (database/sql has no
// option for it); on error t is rolled back.
func (t *sqlTx) setDeferrable(ctx context.Context, opts pgx.TxOptions) error {
	return t.SetDeferrable(ctx, opts)
}

func (t *sqlTx) handlerTx() any { return t.SQL }

// status cannot be read without a round trip: an ended or failed
// transaction shows when the next statement or the COMMIT is refused.
func (t *sqlTx) status() byte { return 'T' }

// ended cannot be known in advance either: the next statement is refused
// with sql.ErrTxDone (isTxDone), and the caller then acts as if it knew.
func (t *sqlTx) ended() bool { return false }

// commitClaim commits a Consumer's transaction only if it still holds the
// claim (sqlCommitClaim; internal/sqldb says how, per driver).
func (t *sqlTx) commitClaim(ctx context.Context) error {
	err := t.CommitClaim(ctx, sqlCommitClaim, sqlCheckClaim)
	if errors.Is(err, sqldb.ErrNoTx) {
		return errTxIdle
	}
	return err
}

// sqlQuerier runs the core's statements through database/sql, with the
// conversions of internal/sqldb.
type sqlQuerier struct{ r sqldb.Runner }

// Exec runs a statement.
func (q sqlQuerier) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	return sqldb.Querier{R: q.r}.Exec(ctx, query, args...)
}

// Query runs a query; its rows read intervals as durations.
func (q sqlQuerier) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	return sqldb.Querier{R: q.r}.Query(ctx, query, args...)
}

// QueryRow runs a query for one row; no row is pgx.ErrNoRows (and
// sql.ErrNoRows).
func (q sqlQuerier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return sqldb.Querier{R: q.r}.QueryRow(ctx, query, args...)
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
