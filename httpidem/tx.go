package httpidem

import (
	"context"
	"net/http"
	"sync"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// request is the per-request state the middleware puts in the context.
type request struct {
	db     pgxDB
	claim  *dedupe.Claim
	txOpts pgx.TxOptions

	mu   sync.Mutex
	tx   *guardedTx // transactional: begun with the claim; leased: begun lazily by Tx
	over bool       // the handler returned: Tx refuses
	err  error      // a failed lazy BEGIN
}

type requestKey struct{}

// Tx returns the transaction of the idempotent request in ctx. Write the
// handler's business rows through it: the middleware stores the response in
// the same transaction and commits both together, or rolls both back when
// the handler answers 5xx or panics.
//
// In transactional mode (the default) the transaction already holds the
// request's claim. In leased mode it is begun on the first call, and a
// handler that never calls Tx runs without a transaction; its response is
// stored on its own.
//
// The transaction belongs to the middleware: Commit and Rollback return
// ErrTxManaged, and once it was ended behind the middleware's back (a COMMIT
// or ROLLBACK sent as a statement, or through Conn()) every statement is
// refused with ErrTxEnded instead of running, and committing, outside it.
// Nested transactions (Begin, savepoints) are allowed. Tx returns ErrNoTx
// outside a request claimed by the middleware (no key on an optional route,
// or a method the middleware does not apply to), and ErrTxManaged once the
// handler has returned.
func Tx(ctx context.Context) (pgx.Tx, error) {
	req, _ := ctx.Value(requestKey{}).(*request)
	if req == nil {
		return nil, ErrNoTx
	}
	req.mu.Lock()
	defer req.mu.Unlock()
	if req.over {
		return nil, newError(http.StatusInternalServerError, ErrTxManaged, "the request is over", nil)
	}
	if req.tx == nil && req.err == nil {
		tx, err := req.db.BeginTx(ctx, req.txOpts)
		if err != nil {
			req.err = newError(http.StatusServiceUnavailable, ErrStore, "begin transaction", err)
		} else {
			req.tx = newGuard(tx)
		}
	}
	if req.err != nil {
		return nil, req.err
	}
	return req.tx, nil
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

// finish ends the handler's use of the request: it returns the request
// transaction's guard, if there is a transaction, and makes any later Tx
// call fail.
func (r *request) finish() *guardedTx {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.over = true
	return r.tx
}
