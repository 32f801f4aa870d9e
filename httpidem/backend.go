package httpidem

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/txopts"
)

// backend is the one seam between the middleware's logic and the database
// client it runs on: pgx (pgxBackend, a pool) or database/sql (sqlBackend,
// a handle wrapped with dedupe.SQL). Everything else — claiming, settling,
// storing, resolving a lost COMMIT — is written once, over reqTx.
type backend interface {
	// claimOnce begins the request transaction with the claim of key in it
	// (transactional mode): one attempt, without retries. For
	// OutcomeClaimed it returns the open transaction, the claim's savepoint
	// (dedupe.ClaimSavepoint) taken after the claim; for any other
	// outcome, and on error, nothing stays open and tx is nil.
	claimOnce(ctx context.Context, m *Middleware, key dedupe.Key) (tx reqTx, claim *dedupe.Claim, err error)
	// begin begins a transaction for the handler (leased mode, on its
	// first call of Tx or SQLTx).
	begin(ctx context.Context, opts pgx.TxOptions) (reqTx, error)
	// isSQL reports whether handlers receive a *sql.Tx (SQLTx) rather than
	// a pgx.Tx (Tx).
	isSQL() bool
}

// reqTx is the request transaction, as the middleware holds it.
type reqTx interface {
	// querier runs the middleware's own statements in the transaction
	// (the stored response, the rollback to the savepoint).
	querier() dedupe.Querier
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
	// state is the transaction's state when the handler returned, as far as
	// it is known without a round trip.
	state() txState
	// handlerTx is what the handler receives: a guarded pgx.Tx or the
	// *sql.Tx.
	handlerTx() any
	// end takes the transaction back from the handler once it returned.
	end()
	// endedBehind reports whether err, returned for one of the middleware's
	// own statements, shows that the handler ended the transaction itself:
	// database/sql's sql.ErrTxDone (its Commit or Rollback called), or the
	// claim's savepoint gone (sqlCheckClaim, or the checked COMMIT, refused:
	// a ROLLBACK sent as a statement, perhaps followed by BEGIN, which pgx's
	// guard cannot tell from a live transaction and database/sql not at all).
	endedBehind(err error) bool
	// checkClaim proves, before the middleware stores anything in the
	// transaction, that it is still the request's (it holds the claim's
	// savepoint), where its COMMIT does not prove it itself: over
	// database/sql a statement the handler's ROLLBACK left outside any
	// transaction would commit on its own. A no-op over pgx, whose COMMIT
	// releases the savepoint first (dedupe.CheckedTxOptions).
	checkClaim(ctx context.Context) error
	// commitStored stores res as claim's result (a transactional claim)
	// and commits, after rolling the handler's effects back to the
	// savepoint taken after the claim when toSavepoint: in one round trip
	// on a connection of the middleware's own (pgx pool), else one
	// statement after the other. Its errors are those of
	// Middleware.commitTx: a lost COMMIT reply is resolved.
	commitStored(ctx context.Context, m *Middleware, claim *dedupe.Claim, res dedupe.Result, toSavepoint bool) error
}

// commitStoredInTurn is commitStored one statement after the other: the
// rollback to the savepoint, the stored result, then COMMIT; a failed
// statement rolls the transaction back and is returned as it is.
func commitStoredInTurn(ctx context.Context, tx reqTx, m *Middleware, claim *dedupe.Claim, res dedupe.Result, toSavepoint bool) error {
	if toSavepoint { // back to the savepoint, which stays for checkClaim
		if _, err := tx.querier().Exec(ctx, sqlRollbackSavepoint); err != nil {
			rollback(ctx, tx)
			return err
		}
	}
	return m.commitAfter(ctx, tx, claim, func() error { return m.inbox.StoreResultTx(ctx, tx.querier(), claim, res) })
}

// endedBehind is reqTx.endedBehind for both clients.
func endedBehind(err error) bool {
	return err != nil && (errors.Is(err, sql.ErrTxDone) || errors.Is(dedupe.CommitError(err), dedupe.ErrTxEnded))
}

// checkedBegin returns opts for the handler's transaction in leased mode:
// its BEGIN takes the claim's savepoint in the same round trip, and its
// COMMIT releases it first (dedupe.CheckedTxOptions).
func checkedBegin(opts pgx.TxOptions) pgx.TxOptions {
	begin := opts.BeginQuery
	if begin == "" {
		begin = "begin"
		if opts.IsoLevel != "" {
			begin += " isolation level " + string(opts.IsoLevel)
		}
		if opts.AccessMode != "" {
			begin += " " + string(opts.AccessMode)
		}
		if opts.DeferrableMode != "" {
			begin += " " + string(opts.DeferrableMode)
		}
	}
	opts.BeginQuery = begin + "; " + sqlClaimSavepoint
	return dedupe.CheckedTxOptions(opts)
}

// newBackend returns the backend of db, a pgx pool or a database/sql
// handle wrapped with dedupe.SQL; false for anything else.
func newBackend(db dedupe.DB) (backend, bool) {
	switch d := db.(type) {
	case *dedupe.SQLDB:
		return sqlBackend{db: d.DB()}, true
	case pgxDB:
		return pgxBackend{db: d}, true
	}
	return nil, false
}

// rollback rolls tx back, if there is one, and returns what the rollback
// returned.
func rollback(ctx context.Context, tx reqTx) error {
	if tx == nil {
		return nil
	}
	return tx.rollback(ctx)
}

// pgxBackend runs the middleware on a pgx pool: the claim is pipelined
// with BEGIN (pipelinedTx), the handler gets the transaction guarded.
type pgxBackend struct{ db pgxDB }

func (b pgxBackend) isSQL() bool { return false }

func (b pgxBackend) claimOnce(ctx context.Context, m *Middleware, key dedupe.Key) (reqTx, *dedupe.Claim, error) {
	p := &pipelinedTx{db: b.db, opts: dedupe.CheckedTxOptions(m.cfg.TxOptions), lockTimeout: m.lockTimeout}
	claim, err := m.inbox.Claim(ctx, p, key)
	if err == nil && claim.Outcome == dedupe.OutcomeClaimed {
		if err = p.settle(ctx); err == nil {
			return &pgxReq{g: newGuard(p.tx), conn: p.conn}, claim, nil
		}
	}
	p.end(context.WithoutCancel(ctx))
	return nil, claim, err
}

func (b pgxBackend) begin(ctx context.Context, opts pgx.TxOptions) (reqTx, error) {
	tx, err := b.db.BeginTx(ctx, checkedBegin(opts))
	if err != nil {
		return nil, err
	}
	return &pgxReq{g: newGuard(tx)}, nil
}

// pgxReq is a pgx request transaction: the handler gets it guarded, the
// middleware runs its statements on the transaction itself. A transaction
// begun with the claim on a pool holds its connection (conn), so that the
// stored result and COMMIT go in one round trip (commitStored) and the
// connection goes back to the pool without a pgx.Tx's own COMMIT; once
// released, done keeps every later call away from it.
type pgxReq struct {
	g    *guardedTx
	conn *pgxpool.Conn // nil: the pgx.Tx releases its connection itself
	done bool
}

func (r *pgxReq) querier() dedupe.Querier          { return r.g.Tx }
func (r *pgxReq) state() txState                   { return stateOf(r.g.Tx) }
func (r *pgxReq) handlerTx() any                   { return r.g }
func (r *pgxReq) end()                             { r.g.End() }
func (r *pgxReq) endedBehind(err error) bool       { return endedBehind(err) }
func (r *pgxReq) checkClaim(context.Context) error { return nil }

func (r *pgxReq) commit(ctx context.Context) error {
	if r.done {
		return pgx.ErrTxClosed
	}
	defer r.release()
	return r.g.Tx.Commit(ctx)
}

func (r *pgxReq) rollback(ctx context.Context) error {
	if r.done {
		return pgx.ErrTxClosed
	}
	defer r.release()
	return r.g.Tx.Rollback(ctx)
}

// release hands the connection back to the pool (which closes it unless
// its transaction ended), once.
func (r *pgxReq) release() {
	r.done = true
	if r.conn != nil {
		r.conn.Release()
		r.conn = nil
	}
}

func (r *pgxReq) commitStored(ctx context.Context, m *Middleware, claim *dedupe.Claim, res dedupe.Result, toSavepoint bool) error {
	if r.done {
		return pgx.ErrTxClosed
	}
	if r.conn == nil {
		return commitStoredInTurn(ctx, r, m, claim, res, toSavepoint)
	}
	b := &pgx.Batch{}
	if toSavepoint {
		b.Queue(sqlRollbackSavepoint)
	}
	b.Queue(sqlCheckClaim) // fails unless this is still the request's transaction
	if err := m.inbox.QueueStoreResult(b, claim, res); err != nil {
		_ = r.rollback(ctx)
		return err
	}
	b.Queue("commit").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" { // the transaction had failed
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	err := r.conn.SendBatch(ctx, b).Close()
	if err != nil && r.conn.Conn().PgConn().TxStatus() != 'I' && !r.conn.Conn().IsClosed() {
		// A statement failed before the COMMIT: the transaction is
		// aborted, and rolled back here.
		_ = r.g.Tx.Rollback(ctx)
	}
	r.release()
	return m.resolveCommit(ctx, claim, err)
}

// stateOf reads tx's state from its connection, without a round trip.
func stateOf(tx pgx.Tx) txState {
	conn := tx.Conn()
	if conn == nil || conn.IsClosed() {
		return txBroken
	}
	switch conn.PgConn().TxStatus() {
	case 'T':
		return txOpen
	case 'E':
		return txAborted
	}
	return txEnded
}

// sqlBackend runs the middleware on database/sql: BEGIN, the lock timeout,
// the claim and the savepoint go one after the other, and the handler gets
// the *sql.Tx, which cannot be guarded (see reqTx.endedBehind).
type sqlBackend struct{ db *sql.DB }

func (b sqlBackend) isSQL() bool { return true }

func (b sqlBackend) claimOnce(ctx context.Context, m *Middleware, key dedupe.Key) (reqTx, *dedupe.Claim, error) {
	tx, err := b.beginTx(ctx, m.cfg.TxOptions, "")
	if err != nil {
		return nil, nil, err
	}
	claim, err := b.claimIn(ctx, m, tx, key)
	if err != nil || claim.Outcome != dedupe.OutcomeClaimed {
		_ = tx.rollback(ctx)
		return nil, claim, err
	}
	return tx, claim, nil
}

// claimIn claims key in tx under the lock timeout, then restores the
// transaction's lock timeout and takes the savepoint (one statement, sent
// as a simple query).
func (b sqlBackend) claimIn(ctx context.Context, m *Middleware, tx *sqlReq, key dedupe.Key) (*dedupe.Claim, error) {
	if _, err := tx.q.Exec(ctx, sqlSetLockTimeout, m.lockTimeout); err != nil {
		return nil, err
	}
	claim, err := m.inbox.Claim(ctx, tx.q, key)
	if err != nil || claim.Outcome != dedupe.OutcomeClaimed {
		return claim, err
	}
	_, err = tx.q.Exec(ctx, sqlRestoreLockTimeout+"; "+sqlClaimSavepoint)
	return claim, err
}

// begin begins the handler's transaction (leased mode) with the claim's
// savepoint.
func (b sqlBackend) begin(ctx context.Context, opts pgx.TxOptions) (reqTx, error) {
	return b.beginTx(ctx, opts, sqlClaimSavepoint)
}

// beginTx begins a transaction and runs then, if not "", in it (with SET
// TRANSACTION DEFERRABLE when opts ask for it, in one statement).
func (b sqlBackend) beginTx(ctx context.Context, opts pgx.TxOptions, then string) (*sqlReq, error) {
	so := txopts.SQL(opts)
	// database/sql rolls a transaction back when the context it was begun
	// with ends: the request's must not end it (the middleware settles the
	// claim after a client went away), only the middleware.
	tx, err := b.db.BeginTx(context.WithoutCancel(ctx), so)
	if err != nil {
		return nil, err
	}
	r := &sqlReq{tx: tx, q: dedupe.SQLTx(tx)}
	if opts.DeferrableMode == pgx.Deferrable {
		then = strings.TrimSuffix("SET TRANSACTION DEFERRABLE; "+then, "; ")
	}
	if then != "" {
		if _, err := r.q.Exec(ctx, then); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
	}
	return r, nil
}

// sqlReq is a database/sql request transaction.
type sqlReq struct {
	tx *sql.Tx
	q  dedupe.Querier // dedupe.SQLTx(tx)
}

func (r *sqlReq) querier() dedupe.Querier        { return r.q }
func (r *sqlReq) commit(context.Context) error   { return r.tx.Commit() }
func (r *sqlReq) rollback(context.Context) error { return r.tx.Rollback() }

// state cannot be read without a round trip: a transaction the handler
// ended shows on the middleware's next statement (endedBehind), a failed
// or broken one when its statements or its COMMIT are refused.
func (r *sqlReq) state() txState             { return txOpen }
func (r *sqlReq) handlerTx() any             { return r.tx }
func (r *sqlReq) end()                       {}
func (r *sqlReq) endedBehind(err error) bool { return endedBehind(err) }

func (r *sqlReq) checkClaim(ctx context.Context) error {
	_, err := r.q.Exec(ctx, sqlCheckClaim)
	return err
}

func (r *sqlReq) commitStored(ctx context.Context, m *Middleware, claim *dedupe.Claim, res dedupe.Result, toSavepoint bool) error {
	return commitStoredInTurn(ctx, r, m, claim, res, toSavepoint)
}
