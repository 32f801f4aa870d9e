package httpidem

import (
	"context"
	"database/sql"
	"net/http"
	"sync"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// request is the per-request state the middleware puts in the context.
type request struct {
	db     backend
	claim  *dedupe.Claim
	txOpts pgx.TxOptions

	mu   sync.Mutex
	tx   reqTx // transactional: begun with the claim; leased: begun lazily by Tx or SQLTx
	over bool  // the handler returned: Tx refuses
	err  error // a failed lazy BEGIN
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
//
// Tx is for a middleware built on a pgx pool; over database/sql, use SQLTx
// (Tx returns ErrWrongDriver).
func Tx(ctx context.Context) (pgx.Tx, error) {
	tx, err := requestTx(ctx, false)
	if err != nil {
		return nil, err
	}
	return tx.handlerTx().(pgx.Tx), nil
}

// SQLTx is Tx for a middleware built on database/sql (New over a handle
// wrapped with dedupe.SQL): it returns the request's *sql.Tx, which holds
// the claim in transactional mode and is begun on the first call in leased
// mode, and which the middleware commits with the stored response or rolls
// back, as with Tx.
//
// A *sql.Tx cannot be guarded: do not call its Commit or Rollback, nor send
// COMMIT or ROLLBACK as a statement. A handler that does is found out on the
// middleware's next statement, which proves that the transaction still
// holds the savepoint taken right after the claim (or BEGIN) before the
// middleware stores anything, and answered as one that ended its
// transaction behind the middleware's back (ErrTxEnded; in transactional
// mode a fresh connection tells whether the claim committed with it):
// nothing is stored in, nor committed with, a transaction the handler ended,
// or began again, and no 2xx is stored for work that did not commit, in
// either mode. Statements the handler sent after its ROLLBACK, outside any
// transaction, committed on their own: the key then answers 500 from now on
// (as over pgx, for every transaction ended behind the middleware's back),
// so that they run at most once. This costs one round trip per request over
// database/sql (and, in leased mode, one more when the handler opens its
// transaction); over pgx the check goes with statements already sent.
//
// SQLTx returns ErrNoTx outside a request claimed by the middleware,
// ErrTxManaged once the handler has returned, and ErrWrongDriver over a
// middleware built on a pgx pool (use Tx).
func SQLTx(ctx context.Context) (*sql.Tx, error) {
	tx, err := requestTx(ctx, true)
	if err != nil {
		return nil, err
	}
	return tx.handlerTx().(*sql.Tx), nil
}

// requestTx returns the transaction of the request in ctx, begun if it is
// not yet; isSQL is whether the caller wants database/sql's.
func requestTx(ctx context.Context, isSQL bool) (reqTx, error) {
	req, _ := ctx.Value(requestKey{}).(*request)
	if req == nil {
		return nil, ErrNoTx
	}
	if req.db.isSQL() != isSQL {
		detail := "the middleware runs on database/sql: use SQLTx"
		if isSQL {
			detail = "the middleware runs on a pgx pool: use Tx"
		}
		return nil, newError(http.StatusInternalServerError, ErrWrongDriver, detail, nil)
	}
	req.mu.Lock()
	defer req.mu.Unlock()
	if req.over {
		return nil, newError(http.StatusInternalServerError, ErrTxManaged, "the request is over", nil)
	}
	if req.tx == nil && req.err == nil {
		tx, err := req.db.begin(ctx, req.txOpts)
		if err != nil {
			req.err = newError(http.StatusServiceUnavailable, ErrStore, "begin transaction", err)
		} else {
			req.tx = tx
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
// transaction, if there is one, and makes any later Tx or SQLTx call fail.
func (r *request) finish() reqTx {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.over = true
	return r.tx
}
