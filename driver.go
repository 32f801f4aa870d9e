package dedupe

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/pgerr"
	"github.com/exactlyonce/dedupe/internal/txguard"
)

// driver is the seam between the core and a database client library: the
// core builds every statement (the SQL lives in sql.go) and runs it through
// a Querier; a driver adds only what a Querier cannot say: how a
// transaction begins with statements queued behind BEGIN, what the handler
// receives as its transaction, and whether LISTEN is available. pgxDriver is
// the default; sqlDriver serves database/sql (SQL).
type driver interface {
	Querier
	// newBatch returns the batch that begin takes for a transaction with
	// opts: pgx queues its BEGIN first, so that no copy is needed.
	newBatch(opts pgx.TxOptions) *pgx.Batch
	// begin begins a transaction with opts and runs b's statements in it
	// (b from newBatch(opts), or nil). pgx sends BEGIN and b in one round
	// trip; database/sql sends BEGIN alone, then b in one round trip over
	// pgx's stdlib, or one statement after the other over other drivers
	// (the callbacks queued in b tell which by the row they get: skipRow).
	// On error, and when a statement's callback panics, nothing stays open.
	begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (txConn, error)
	// pipelines reports whether statements queued in a batch are always
	// sent together (pgx), or possibly one by one (database/sql).
	pipelines() bool
	// txType is the type of transaction this driver's handlers receive.
	txType() reflect.Type
	// listenPool is the pool whose configuration LISTEN connections copy,
	// nil when the driver cannot LISTEN.
	listenPool() *pgxpool.Pool
}

// txConn is a transaction begun by a driver.
type txConn interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
	// handlerTx is what a handler receives: a guarded pgx.Tx, or *sql.Tx.
	handlerTx() any
	// status is 'T' in a transaction, 'E' in a failed one, 'I' after its
	// end, as far as the driver can tell without a round trip.
	status() byte
	// ended reports whether the handler ended the transaction itself.
	ended() bool
	// commitClaim commits a Consumer's transaction only if it still holds
	// the claim (sqlCommitClaim), in the round trip of COMMIT alone where
	// the driver can.
	commitClaim(ctx context.Context) error
}

// newDriver returns the driver for db: a database/sql handle wrapped with
// SQL, or a pgx pool or connection.
func newDriver(db DB) (driver, error) {
	switch d := db.(type) {
	case nil:
		return nil, &ConfigError{Field: "db", Reason: "must not be nil"}
	case *SQLDB:
		return d, nil
	case pgxDB:
		return pgxDriver{pgxDB: d, direct: newPgxDirect(d)}, nil
	}
	return nil, &ConfigError{Field: "db", Reason: fmt.Sprintf("%T is neither a pgx pool or connection nor a database/sql handle wrapped with dedupe.SQL", db)}
}

// pgxDB is a pgx pool or connection (*pgxpool.Pool, *pgx.Conn).
type pgxDB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// pgxDriver is the driver of a pgx pool or connection. direct, when not
// nil, sends a Consumer's claim round straight over pgconn (driver.go, internal/direct).
type pgxDriver struct {
	pgxDB
	direct *pgxDirect
}

var pgxTxType = reflect.TypeFor[pgx.Tx]()

func (d pgxDriver) txType() reflect.Type { return pgxTxType }
func (d pgxDriver) pipelines() bool      { return true }

func (d pgxDriver) listenPool() *pgxpool.Pool {
	p, _ := d.pgxDB.(*pgxpool.Pool)
	return p
}

func (d pgxDriver) newBatch(opts pgx.TxOptions) *pgx.Batch {
	b := &pgx.Batch{}
	b.BeginTx(opts)
	return b
}

func (d pgxDriver) begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (txConn, error) {
	if b == nil {
		tx, err := d.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		return (*pgxTx)(newGuard(tx)), nil
	}
	br := d.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return (*pgxTx)(newGuard(tx)), nil
}

// pgxTx is a pgx transaction as the core uses it: the guard the handler
// receives, seen without the guard's methods, so that the core's own
// statements, Commit and Rollback reach the transaction itself (the
// embedded pgx.Tx) in the same allocation.
type pgxTx guardedTx

func (t *pgxTx) handlerTx() any { return (*guardedTx)(t) }
func (t *pgxTx) status() byte   { return (*guardedTx)(t).Status() }
func (t *pgxTx) ended() bool    { return (*guardedTx)(t).Ended() }

// commitClaim is Commit: a Consumer's transaction was begun with
// sqlCommitClaim as its CommitQuery (txDriver.checkCommits).
func (t *pgxTx) commitClaim(ctx context.Context) error { return t.Commit(ctx) }

// sendBatch runs b's statements on q: in one round trip when q is a pgx
// pool, connection or transaction, else one after the other.
func sendBatch(ctx context.Context, q Querier, b *pgx.Batch) error {
	if s, ok := q.(interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}); ok {
		return s.SendBatch(ctx, b).Close()
	}
	for _, qq := range b.QueuedQueries {
		if qq.Fn == nil {
			if _, err := q.Exec(ctx, qq.SQL, qq.Arguments...); err != nil {
				return err
			}
			continue
		}
		if err := qq.Fn(&seqResults{ctx: ctx, q: q, qq: qq}); err != nil {
			return err
		}
	}
	return nil
}

// seqResults are the results of one queued statement run on its own, for a
// QueuedQuery's callback.
type seqResults struct {
	ctx context.Context
	q   Querier
	qq  *pgx.QueuedQuery
}

func (r *seqResults) Exec() (pgconn.CommandTag, error) {
	return r.q.Exec(r.ctx, r.qq.SQL, r.qq.Arguments...)
}
func (r *seqResults) Query() (pgx.Rows, error) { return r.q.Query(r.ctx, r.qq.SQL, r.qq.Arguments...) }
func (r *seqResults) QueryRow() pgx.Row        { return lazyRow{r} }

// lazyRow runs its statement when it is scanned, so that a callback may
// skip a statement whose answer it already knows (skipRow): what a driver
// that sends statements one by one saves, and a pipeline cannot.
type lazyRow struct{ r *seqResults }

func (l lazyRow) Scan(dest ...any) error {
	return l.r.q.QueryRow(l.r.ctx, l.r.qq.SQL, l.r.qq.Arguments...).Scan(dest...)
}

// skipRow reports whether row's statement may be left unsent: true for a
// statement run one by one (lazyRow), false in a pipeline, where it was
// sent already and must be read.
func skipRow(row pgx.Row) bool {
	_, ok := row.(lazyRow)
	return ok
}

// pipelinedSavepoint is the flag of a savepoint sent in a pipeline: always.
var pipelinedSavepoint = true

// queueSavepoint queues the savepoint taken right after a claim. In a
// pipeline it is sent with the claim; run one by one (which a driver that
// does not always pipeline may do) it is sent only for a new key (a
// duplicate needs none). The returned flag tells whether it ran.
func queueSavepoint(d driver, b *pgx.Batch, round *claimRound) *bool {
	if d.pipelines() {
		b.Queue(sqlSavepoint)
		return &pipelinedSavepoint
	}
	done := new(bool)
	b.Queue(sqlSavepoint).QueryRow(func(row pgx.Row) error {
		if !round.inserted && skipRow(row) {
			return nil
		}
		*done = true
		if err := row.Scan(); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return nil
	})
	return done
}
func (r *seqResults) Close() error { return nil }
func (r *seqResults) Tx() pgx.Tx   { return nil }

// errWrongTx is a handler whose transaction type is not its inbox's.
func errWrongTx[TTx any](d driver) error {
	return &ConfigError{Field: "handler", Reason: fmt.Sprintf("takes a %v but the inbox's driver gives its handlers a %v",
		reflect.TypeFor[TTx](), d.txType())}
}

// eraseTx checks that TTx is the transaction type of d's handlers and
// returns h over the driver's handler transaction.
func eraseTx[TTx, M any](d driver, h func(ctx context.Context, tx TTx, msg M) error) (func(context.Context, any, M) error, error) {
	if reflect.TypeFor[TTx]() != d.txType() {
		return nil, errWrongTx[TTx](d)
	}
	return func(ctx context.Context, tx any, msg M) error { return h(ctx, tx.(TTx), msg) }, nil
}

// isTxDone reports an error of a transaction that was already ended.
func isTxDone(err error) bool { return pgerr.IsTxDone(err) }

// inTx runs f in a transaction of d and commits it when f returns nil.
func inTx(ctx context.Context, d driver, f func(tx Querier) error) error {
	tx, err := d.begin(ctx, pgx.TxOptions{}, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// guardedTx is the transaction a handler receives: the claim's own, whose
// end belongs to dedupe (internal/txguard, shared with httpidem). Commit and
// Rollback are refused with ErrTxOwned (the handler returns nil to commit,
// an error to roll back), and once the transaction was ended behind
// dedupe's back (a COMMIT or ROLLBACK sent as a statement, or through
// Conn()) every further statement is refused with ErrTxEnded instead of
// running outside any transaction. Begin opens a savepoint as pgx does; the
// handler may commit or roll back that. No check costs a round trip.
type guardedTx = txguard.Tx

// errStatementRefused is the guard's refusal of a statement after the end.
var errStatementRefused = fmt.Errorf("%w: statement refused", ErrTxEnded)

// newGuard wraps tx, the claim's transaction.
func newGuard(tx pgx.Tx) *guardedTx { return txguard.New(tx, ErrTxOwned, errStatementRefused) }

// checkGuard is run after the handler returned nil: the transaction must
// still be open and healthy, or nothing may be reported as processed.
func checkGuard(g txConn) error {
	switch g.status() {
	case 'T':
		return nil
	case 'E':
		return fmt.Errorf("%w: a statement failed and the handler returned nil", ErrTxEnded)
	default:
		return fmt.Errorf("%w: the transaction is no longer open", ErrTxEnded)
	}
}

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
