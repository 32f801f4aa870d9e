package dedupe

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/txopts"
)

// The direct claim round over database/sql. Over pgx's stdlib a Consumer's
// claim follows BEGIN (which database/sql sends alone) through the
// *pgx.Conn under the *sql.Tx: the lock timeout, the claim and the
// savepoint in one round trip, and the read of an existing key with them or
// after them, sent as the pgx driver's direct round sends them
// (pgxdirect.go, sendDirect). Where the connection is not pgx's
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
