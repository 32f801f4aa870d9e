package direct

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The round over pgx. On a pgx pool or connection in pgx's default
// statement mode (QueryExecModeCacheStatement) and without a tracer, a
// Consumer sends BEGIN, its lock timeout, the claim, the peek and the
// savepoint as one pgconn batch: one write, one Sync, one round trip, the
// same statements pgx's pipelined batch would send. The claim and the peek
// are prepared once per connection under names of their own, and their
// values are encoded and decoded in PostgreSQL's binary format (wire.go).
// What this saves is pgx's pipeline bookkeeping (a list element and result
// state per queued statement) and its per-value type plans: about 40
// allocations per message.
//
// The handler still receives pgx's own transaction: pgx adopts the
// transaction begun here through a batch whose only queued statement, the
// BEGIN that Batch.BeginTx queues, was taken out again (Begin, Adopt). Sent
// on a connection, a batch without statements sends nothing, and the
// transaction that Batch.BeginTx promised is the one the connection is in.
//
// Anywhere else (a tracer, which must see every statement; another
// statement mode, such as one chosen for PgBouncer; a type that is neither
// pool nor connection; database/sql other than over pgx's stdlib, whose
// round internal/sqldb sends through Claim) the round goes through pgx's
// batch.

// Sender sends direct rounds over a pgx pool or a connection.
type Sender struct {
	pool *pgxpool.Pool
	conn *pgx.Conn
}

// NewSender returns the direct round's sender for db, or nil where the
// round must go through pgx: db is neither a *pgxpool.Pool nor a
// *pgx.Conn, or its configuration does not allow the round (Allowed).
func NewSender(db any) *Sender {
	var (
		cfg *pgx.ConnConfig
		s   Sender
	)
	switch db := db.(type) {
	case *pgxpool.Pool:
		cfg, s.pool = db.Config().ConnConfig, db
	case *pgx.Conn:
		cfg, s.conn = db.Config(), db
	default:
		return nil
	}
	if !Allowed(cfg) {
		return nil
	}
	return &s
}

// ClaimFunc sends a claim's round on conn, whose state st allows it: BEGIN
// first unless begin is nil (the transaction is open already). The root's
// claim round is one (Claim, and its result turned into a claim).
type ClaimFunc func(conn *pgx.Conn, st *Conn, begin *Stmt) error

// Round begins a transaction on a connection of s and runs claim on it
// with begin's BEGIN: BEGIN, the lock timeout, the claim, the peek and the
// savepoint in one round trip (Claim). It returns pgx's own transaction,
// on a pool's connection released when the transaction ends.
//
// It returns ErrNoDirect, having sent nothing, when the connection's own
// configuration refuses the round (a BeforeConnect hook that sets a tracer
// or another statement mode), or ErrTypes, having rolled back what it sent,
// when the inbox table's column types are not the round's: the claim must
// go through pgx's batch instead. A statement of stmts prepared earlier on
// the connection that went away or changed is prepared anew, once.
func (s *Sender) Round(ctx context.Context, stmts *Stmts, begin *Begin, claim ClaimFunc) (pgx.Tx, error) {
	conn, pc := s.conn, (*pgxpool.Conn)(nil)
	if s.pool != nil {
		var err error
		if pc, err = s.pool.Acquire(ctx); err != nil {
			return nil, err
		}
		conn = pc.Conn()
	}
	release := func() {
		if pc != nil {
			pc.Release()
		}
	}
	st := StateOf(conn)
	if !st.OK() {
		release()
		return nil, ErrNoDirect
	}
	for try := 0; ; try++ {
		err := claim(conn, st, &begin.Stmt)
		if err == nil {
			tx, err := Adopt(ctx, conn, begin)
			if err != nil {
				RollbackConn(ctx, conn)
				release()
				return nil, err
			}
			if pc != nil {
				tx = &pooledTx{Tx: tx, conn: pc}
			}
			return tx, nil
		}
		RollbackConn(ctx, conn)
		if try == 0 && StaleStatement(err) && !conn.IsClosed() {
			// A statement prepared on this connection went away (DEALLOCATE
			// ALL) or its result type changed (ALTER TABLE): prepare anew.
			derr := stmts.Deallocate(ctx, conn, &begin.Stmt)
			if derr == nil {
				continue
			}
			err = errors.Join(err, derr)
		}
		release()
		return nil, err
	}
}

// Claim sends one round on conn (Send) and learns the state of a key its
// claim finds taken: one round trip, and a second for the read of a taken
// key (PeekAfter) when none of the inbox's recent claims met a duplicate
// (ahead). Both drivers' direct rounds claim through it, so that they send
// the same.
func Claim(ctx context.Context, conn *pgx.Conn, st *Conn, stmts *Stmts, ahead *Ahead, begin *Stmt, args *Args, res *Result) error {
	n, peek := ahead.Next()
	if err := Send(ctx, conn, st, stmts, begin, args, peek, res); err != nil {
		return err
	}
	if !res.Inserted {
		ahead.Found(n)
		if !peek {
			return PeekAfter(ctx, conn, stmts, args, res)
		}
	}
	return nil
}

// pooledTx is a transaction on a connection acquired from a pool, which it
// releases when it ends, as pgxpool's own transaction does.
type pooledTx struct {
	pgx.Tx
	conn *pgxpool.Conn
}

func (t *pooledTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.release()
	return err
}

func (t *pooledTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.release()
	return err
}

func (t *pooledTx) release() {
	if t.conn != nil {
		t.conn.Release()
		t.conn = nil
	}
}
