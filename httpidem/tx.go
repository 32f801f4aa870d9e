package httpidem

import (
	"context"
	"sync"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// request is the per-request state the middleware puts in the context.
type request struct {
	db     dedupe.DB
	claim  *dedupe.Claim
	txOpts pgx.TxOptions

	mu  sync.Mutex
	tx  pgx.Tx // begun lazily by Tx
	err error
}

type requestKey struct{}

// Tx returns the transaction of the idempotent request in ctx, beginning it
// on the first call. Write the handler's business rows through it: the
// middleware stores the response in the same transaction and commits both
// together, or rolls both back when the handler answers 5xx or panics. A
// handler that never calls Tx runs without a transaction and its response is
// stored on its own.
//
// The handler must not Commit or Rollback the transaction (they return
// ErrTxManaged); nested transactions (Begin, savepoints) are allowed. Tx
// returns ErrNoTx outside a request claimed by the middleware (no key on an
// optional route, or a method the middleware does not apply to).
func Tx(ctx context.Context) (pgx.Tx, error) {
	req, _ := ctx.Value(requestKey{}).(*request)
	if req == nil {
		return nil, ErrNoTx
	}
	req.mu.Lock()
	defer req.mu.Unlock()
	if req.tx == nil && req.err == nil {
		tx, err := req.db.BeginTx(ctx, req.txOpts)
		if err != nil {
			req.err = newError(503, ErrStore, "begin transaction", err)
		} else {
			req.tx = tx
		}
	}
	if req.err != nil {
		return nil, req.err
	}
	return managedTx{req.tx}, nil
}

// ClaimFromContext returns the claim of the idempotent request in ctx (its
// key, tenant and attempt number), or nil outside one. Use
// Claim.DerivedKey to derive Idempotency-Keys for calls the handler makes to
// other APIs.
func ClaimFromContext(ctx context.Context) *dedupe.Claim {
	if req, _ := ctx.Value(requestKey{}).(*request); req != nil {
		return req.claim
	}
	return nil
}

// takeTx returns the transaction begun by the handler, if any, and forbids
// any later Tx call from beginning another.
func (r *request) takeTx() pgx.Tx {
	r.mu.Lock()
	defer r.mu.Unlock()
	tx := r.tx
	if r.err == nil {
		r.err = newError(500, ErrTxManaged, "the request is over", nil)
	}
	return tx
}

// managedTx is the handler's view of the request transaction: the
// middleware alone ends it.
type managedTx struct{ pgx.Tx }

// Commit refuses: the middleware commits after storing the response.
func (managedTx) Commit(context.Context) error { return ErrTxManaged }

// Rollback refuses: answer 5xx (or panic) to roll the work back.
func (managedTx) Rollback(context.Context) error { return ErrTxManaged }
