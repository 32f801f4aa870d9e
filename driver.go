package dedupe

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/pgbatch"
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
	// (the callbacks queued in b tell which by the row they get: pgbatch.SkipRow).
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
// pool, connection or transaction, else one after the other
// (internal/pgbatch).
func sendBatch(ctx context.Context, q Querier, b *pgx.Batch) error { return pgbatch.Send(ctx, q, b) }

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
		if !round.inserted && pgbatch.SkipRow(row) {
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

// pgxDirect sends a Consumer's claim round straight over pgconn where the
// pool or connection allows it (internal/direct, whose sender.go says
// when): BEGIN, the lock timeout, the claim, the peek and the savepoint in
// one round trip, about 40 allocations per message fewer than pgx's batch.
type pgxDirect struct {
	*direct.Sender
	// off is set once a connection's own configuration refused the round
	// (a BeforeConnect hook that sets a tracer or another statement mode):
	// the pool's connections are made alike, so its claims go through
	// pgx's batch from then on.
	off atomic.Bool
}

// newPgxDirect returns the direct round's sender for db, or nil where the
// round must go through pgx.
func newPgxDirect(db pgxDB) *pgxDirect {
	s := direct.NewSender(db)
	if s == nil {
		return nil
	}
	return &pgxDirect{Sender: s}
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

// claimDirect begins a transaction on a connection of d and claims r in
// it, in the direct round (direct.Sender.Round). It returns
// direct.ErrNoDirect, having sent nothing, or direct.ErrTypes, having
// rolled back what it sent, when the round must go through pgx instead.
func (d *pgxDirect) claimDirect(ctx context.Context, i *Inbox, begin *direct.Begin, lockTimeout string, r *claimReq) (txConn, *claimRound, error) {
	// Encoded before a connection is acquired: it reads Config.Clock,
	// which may panic (a test's), and must not leave a connection behind.
	args := &direct.Args{}
	args.Encode(i.directParams(r), lockTimeout)
	var res direct.Result
	tx, err := d.Round(ctx, i.direct, &i.ahead, begin, args, &res)
	if err != nil {
		switch {
		case errors.Is(err, direct.ErrNoDirect):
			if d.off.CompareAndSwap(false, true) {
				i.cfg.Logger.DebugContext(ctx, "dedupe: the pool's connections are configured for pgx's batch (a tracer or another statement mode); claims go through it")
			}
		case errors.Is(err, direct.ErrTypes):
			i.directOff(ctx)
		}
		return nil, nil, err
	}
	return (*pgxTx)(newGuard(tx)), roundOf(&res, r.key), nil
}

// sendDirect claims r on conn in the direct round (direct.Claim), over
// database/sql's pgx connection (SQLDB.claimDirect).
func sendDirect(ctx context.Context, conn *pgx.Conn, st *direct.Conn, i *Inbox, begin *direct.Stmt, args *direct.Args, r *claimReq) (*claimRound, error) {
	var res direct.Result
	if err := direct.Claim(ctx, conn, st, i.direct, &i.ahead, begin, args, &res); err != nil {
		return nil, err
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
