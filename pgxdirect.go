package dedupe

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/direct"
)

// The direct claim round. On a pgx pool or connection in pgx's default
// statement mode (QueryExecModeCacheStatement) and without a tracer, a
// Consumer sends BEGIN, its lock timeout, the claim, the peek (see
// internal/direct) and the savepoint as one pgconn batch: one write, one Sync,
// one round trip, the same statements pgx's pipelined batch would send. The
// claim and the peek are prepared once per connection under names of their
// own, and their values are encoded and decoded here in PostgreSQL's binary
// format (internal/direct). What this saves is pgx's pipeline bookkeeping (a list
// element and result state per queued statement) and its per-value type
// plans: about 40 allocations per message.
//
// The handler still receives pgx's own transaction: pgx adopts the
// transaction begun here through a batch whose only queued statement, the
// BEGIN that Batch.BeginTx queues, was taken out again (direct.Begin). Sent
// on a connection, a batch without statements sends nothing, and the
// transaction that Batch.BeginTx promised is the one the connection is in.
//
// Anywhere else (a tracer, which must see every statement; another
// statement mode, such as one chosen for PgBouncer; a type that is neither
// pool nor connection; database/sql other than over pgx's stdlib, whose
// round SQLDB.claimDirect sends through sendDirect) the round goes through pgx's
// batch.

// pgxDirect sends direct claim rounds over a pool or a connection.
type pgxDirect struct {
	pool *pgxpool.Pool
	conn *pgx.Conn
	// off is set once a connection's own configuration refused the round
	// (a BeforeConnect hook that sets a tracer or another statement mode):
	// the pool's connections are made alike, so its claims go through
	// pgx's batch from then on.
	off atomic.Bool
}

// newPgxDirect returns the direct round's sender for db, or nil where the
// round must go through pgx.
func newPgxDirect(db pgxDB) *pgxDirect {
	var (
		cfg *pgx.ConnConfig
		d   pgxDirect
	)
	switch db := db.(type) {
	case *pgxpool.Pool:
		cfg, d.pool = db.Config().ConnConfig, db
	case *pgx.Conn:
		cfg, d.conn = db.Config(), db
	default:
		return nil
	}
	if !direct.Allowed(cfg) {
		return nil
	}
	return &d
}

// directOff sends the inbox's claims through pgx's batch from now on: a
// connection prepared the direct round's statements with other types than
// the round's (the inbox table was altered).
func (i *Inbox) directOff(ctx context.Context) {
	if i.direct.Off.CompareAndSwap(false, true) {
		i.cfg.Logger.WarnContext(ctx, "dedupe: the inbox table's column types are not the migration's; claims go through pgx's batch from now on",
			"table", i.table)
	}
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

// claimDirect begins a transaction on a connection of d and claims r in
// it: BEGIN (begin.sql), the lock timeout when set, the claim, the peek
// (when the inbox's recent claims met duplicates: internal/direct.Ahead) and the
// savepoint, in one round trip; a claim that found its key taken without
// the peek reads it in a second. It returns direct.ErrNoDirect, having sent
// nothing, or direct.ErrTypes, having rolled back what it sent, when the
// round must go through pgx instead.
func (d *pgxDirect) claimDirect(ctx context.Context, i *Inbox, begin *direct.Begin, lockTimeout string, r *claimReq) (txConn, *claimRound, error) {
	// Encoded before a connection is acquired: it reads Config.Clock,
	// which may panic (a test's), and must not leave a connection behind.
	args := &direct.Args{}
	args.Encode(i.directParams(r), lockTimeout)
	conn, pc := d.conn, (*pgxpool.Conn)(nil)
	if d.pool != nil {
		var err error
		if pc, err = d.pool.Acquire(ctx); err != nil {
			return nil, nil, err
		}
		conn = pc.Conn()
	}
	release := func() {
		if pc != nil {
			pc.Release()
		}
	}
	st := direct.StateOf(conn)
	if !st.OK() {
		release()
		if d.off.CompareAndSwap(false, true) {
			i.cfg.Logger.DebugContext(ctx, "dedupe: the pool's connections are configured for pgx's batch (a tracer or another statement mode); claims go through it")
		}
		return nil, nil, direct.ErrNoDirect
	}
	for try := 0; ; try++ {
		round, err := sendDirect(ctx, conn, st, i, &begin.Stmt, args, r)
		if err == nil {
			tx, err := direct.Adopt(ctx, conn, begin)
			if err != nil {
				direct.RollbackConn(ctx, conn)
				release()
				return nil, nil, err
			}
			if pc != nil {
				tx = &pooledTx{Tx: tx, conn: pc}
			}
			return (*pgxTx)(newGuard(tx)), round, nil
		}
		direct.RollbackConn(ctx, conn)
		if try == 0 && direct.StaleStatement(err) && !conn.IsClosed() {
			// A statement prepared on this connection went away (DEALLOCATE
			// ALL) or its result type changed (ALTER TABLE): prepare anew.
			derr := i.direct.Deallocate(ctx, conn, &begin.Stmt)
			if derr == nil {
				continue
			}
			err = errors.Join(err, derr)
		}
		release()
		if errors.Is(err, direct.ErrTypes) {
			i.directOff(ctx)
		}
		return nil, nil, err
	}
}

// sendDirect claims r on conn in the direct round and learns the state of a
// key it finds taken: one round trip, and a second for the read of a taken
// key when the inbox's recent claims met no duplicate (internal/direct.Ahead). Both
// drivers' direct rounds claim through it, so that they send the same.
func sendDirect(ctx context.Context, conn *pgx.Conn, st *direct.Conn, i *Inbox, begin *direct.Stmt, args *direct.Args, r *claimReq) (*claimRound, error) {
	var res direct.Result
	n, ahead := i.ahead.Next()
	if err := direct.Send(ctx, conn, st, i.direct, begin, args, ahead, &res); err != nil {
		return nil, err
	}
	if !res.Inserted {
		i.ahead.Found(n)
		if !ahead {
			if err := direct.PeekAfter(ctx, conn, i.direct, args, &res); err != nil {
				return nil, err
			}
		}
	}
	return roundOf(&res, r.key), nil
}

// directParams are the values of r's claim that the direct round encodes.
func (i *Inbox) directParams(r *claimReq) *direct.Params {
	return &direct.Params{Now: i.cfg.now(), Scope: r.key.Scope, ID: r.key.ID, State: string(r.state),
		Fingerprint: r.key.Fingerprint, Token: r.token, Lease: i.cfg.Lease, Retention: i.cfg.Retention}
}

// roundOf is the claim round of a direct round's result for key.
func roundOf(res *direct.Result, key Key) *claimRound {
	round := &claimRound{inserted: res.Inserted, row: claimRow{state: res.Row.State, attempts: res.Row.Attempts,
		lockedUntil: res.Row.LockedUntil, left: res.Row.Left}}
	if res.Peeked {
		p := &res.Peek
		round.rec = &Record{Key: Key{Scope: key.Scope, ID: key.ID, Fingerprint: p.Fingerprint}, State: State(p.State),
			Attempts: p.Attempts, Token: p.Token, LockedUntil: p.LockedUntil, ReadAt: p.ReadAt}
	}
	return round
}
