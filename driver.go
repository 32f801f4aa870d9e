package dedupe

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/direct"
	idriver "github.com/exactlyonce/dedupe/internal/driver"
	"github.com/exactlyonce/dedupe/internal/pgbatch"
	"github.com/exactlyonce/dedupe/internal/pgxdriver"
	"github.com/exactlyonce/dedupe/internal/sqldb"
)

// driver is the seam between the core and a database client library
// (internal/driver): the core builds every statement (the SQL lives in
// sql.go) and runs it through a Querier; a driver adds only what a Querier
// cannot say: how a transaction begins with statements queued behind
// BEGIN, what the handler receives as its transaction, and whether LISTEN
// is available. internal/pgxdriver is the default; internal/sqldb's Driver
// serves database/sql (SQL).
type driver = idriver.Driver

// txConn is a transaction begun by a driver.
type txConn = idriver.Tx

// newDriver returns the driver for db: a database/sql handle wrapped with
// SQL, or a pgx pool or connection. A handler's pgx transaction refuses
// Commit and Rollback with ErrTxOwned, and every statement after the
// handler ended it with ErrTxEnded (internal/txguard).
func newDriver(db DB) (driver, error) {
	switch d := db.(type) {
	case nil:
		return nil, &ConfigError{Field: "db", Reason: "must not be nil"}
	case *SQLDB:
		return d.drv, nil
	case pgxdriver.DB:
		return pgxdriver.New(d, ErrTxOwned, errStatementRefused), nil
	}
	return nil, &ConfigError{Field: "db", Reason: fmt.Sprintf("%T is neither a pgx pool or connection nor a database/sql handle wrapped with dedupe.SQL", db)}
}

// errStatementRefused is the guard's refusal of a statement after the end.
var errStatementRefused = fmt.Errorf("%w: statement refused", ErrTxEnded)

// sendBatch runs b's statements on q: in one round trip when q is a pgx
// pool, connection or transaction, else one after the other
// (internal/pgbatch).
func sendBatch(ctx context.Context, q Querier, b *pgx.Batch) error { return pgbatch.Send(ctx, q, b) }

// queueSavepoint queues the savepoint taken right after a claim: sent with
// the claim in a pipeline, and run one by one (database/sql) only for a new
// key (pgbatch.QueueUnlessSkipped). The returned flag tells whether it ran.
func queueSavepoint(d driver, b *pgx.Batch, round *claimRound) *bool {
	return pgbatch.QueueUnlessSkipped(b, d.Pipelines(), sqlSavepoint, &round.inserted)
}

// errWrongTx is a handler whose transaction type is not its inbox's.
func errWrongTx[TTx any](d driver) error {
	return &ConfigError{Field: "handler", Reason: fmt.Sprintf("takes a %v but the inbox's driver gives its handlers a %v",
		reflect.TypeFor[TTx](), d.TxType())}
}

// eraseTx checks that TTx is the transaction type of d's handlers and
// returns h over the driver's handler transaction.
func eraseTx[TTx, M any](d driver, h func(ctx context.Context, tx TTx, msg M) error) (func(context.Context, any, M) error, error) {
	if reflect.TypeFor[TTx]() != d.TxType() {
		return nil, errWrongTx[TTx](d)
	}
	return func(ctx context.Context, tx any, msg M) error { return h(ctx, tx.(TTx), msg) }, nil
}

// inTx runs f in a transaction of d and commits it when f returns nil.
func inTx(ctx context.Context, d driver, f func(tx Querier) error) error {
	tx, err := d.Begin(ctx, pgx.TxOptions{}, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// checkGuard is run after the handler returned nil: the transaction must
// still be open and healthy, or nothing may be reported as processed.
func checkGuard(g txConn) error {
	switch g.Status() {
	case 'T':
		return nil
	case 'E':
		return fmt.Errorf("%w: a statement failed and the handler returned nil", ErrTxEnded)
	default:
		return fmt.Errorf("%w: the transaction is no longer open", ErrTxEnded)
	}
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

// claimDirect begins the claim's transaction and claims r in it in the
// direct round of the inbox's driver, where it can send one (internal/direct):
// over a pgx pool or connection, BEGIN, the lock timeout, the claim, the
// peek and the savepoint in one round trip, about 40 allocations per message
// fewer than pgx's batch; over database/sql on pgx's stdlib, BEGIN alone,
// then the rest in one round trip through the *pgx.Conn under the *sql.Tx.
// It returns direct.ErrNoDirect, having claimed nothing, or
// direct.ErrTypes, having rolled back what it sent, when the claim must go
// through the driver's batch instead.
func (i *Inbox) claimDirect(ctx context.Context, begin *direct.Begin, opts pgx.TxOptions, lockTimeout string, r *claimReq) (txConn, *claimRound, error) {
	if i.direct == nil || i.direct.Off.Load() {
		return nil, nil, direct.ErrNoDirect
	}
	pd, _ := i.drv.(*pgxdriver.Driver)
	sd, _ := i.drv.(*sqldb.Driver)
	if !(pd != nil && pd.Direct() && begin != nil) && !(sd != nil && sd.Direct()) {
		return nil, nil, direct.ErrNoDirect
	}
	// Encoded before a connection is acquired: it reads Config.Clock,
	// which may panic (a test's), and must not leave a connection behind.
	args := &direct.Args{}
	args.Encode(i.directParams(r), lockTimeout)
	var round *claimRound
	claim := func(conn *pgx.Conn, st *direct.Conn, begin *direct.Stmt) error {
		var res direct.Result
		if err := direct.Claim(ctx, conn, st, i.direct, &i.ahead, begin, args, &res); err != nil {
			return err
		}
		round = roundOf(&res, r.key)
		return nil
	}
	var (
		tx  txConn
		err error
	)
	if pd != nil {
		tx, err = pd.ClaimDirect(ctx, i.cfg.Logger, i.direct, begin, claim)
	} else if tx, err = sd.ClaimDirect(ctx, opts, claim); err != nil && direct.StaleStatement(err) {
		// A statement went stale inside a transaction begun already: the
		// connection's next round prepares it anew, and the claim may run
		// again in a new transaction.
		err = wrap(ErrRetryable, err)
	}
	if errors.Is(err, direct.ErrTypes) {
		i.directOff(ctx)
	}
	if err != nil {
		return nil, nil, err
	}
	return tx, round, nil
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
