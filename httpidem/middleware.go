// Package httpidem is the Idempotency-Key layer for HTTP APIs, on top of
// dedupe: net/http middleware for the server, a retrying http.RoundTripper
// for the client, and ETag/If-Match helpers for optimistic concurrency.
//
// The middleware claims (tenant, Idempotency-Key) atomically before the
// handler runs. A concurrent request with the same key gets 409 (nothing
// recorded, retry later), the same key with a different request 422, and a
// completed key the stored status, headers and body with
// "Idempotent-Replayed: true". Responses are buffered and sent only after
// the commit.
//
// In transactional mode (the default) the claim is inserted in the request's
// transaction, the one Tx returns: the claim, the handler's writes and the
// stored response commit together, in one transaction: BEGIN and the claim
// cost one round trip, and over a pgx pool the stored response and COMMIT
// another. A concurrent duplicate waits for the holder at
// most Config.LockTimeout (100 ms by default) and then answers 409. In leased
// mode (Config.Mode, Middleware.Leased), for handlers with effects outside
// the database, the claim commits first as in flight with a lease (90 s by
// default), so that a duplicate answers 409 at once and a process that died
// mid-request blocks the key only until the lease ends; the handler's
// transaction, if it opens one, commits with the stored response.
//
// In both modes a 5xx answer or a panic rolls the handler's work back and
// stores the error response (see ServerErrorPolicy). A client is never
// answered a success for work that did not commit: a handler that returns
// after its context ended (the client went away, or it ran past the lease,
// see Config.Inbox), or that writes an error status after a success status,
// is not stored, whatever it answered; its work is rolled back, the key is
// released, and the client gets a retryable 503 with Retry-After
// (ErrRolledBack) in place of a success. A COMMIT whose reply was lost is resolved on a
// fresh connection: a committed request answers with its response, one that
// did not commit or cannot be resolved answers 503 (retryable), never
// claiming that the work was rolled back when it may not have been. Keys are
// kept 24 h by default and purged with Middleware.Purge or
// Middleware.RunPurger.
//
// The middleware runs on a pgx pool, whose handlers take the request
// transaction with Tx, or on database/sql (New over dedupe.SQL(db)), whose
// handlers take it with SQLTx, a *sql.Tx: both modes and every guarantee
// above hold on either; over database/sql, BEGIN, the lock timeout, the claim
// and the savepoint are sent one after the other rather than in one round
// trip, and a handler that ends its *sql.Tx itself (its Commit or Rollback,
// or a statement) is found out before anything of it is stored (see SQLTx).
//
// Responses over Config.MaxResponseBytes (1 MiB by default) are refused:
// the work is rolled back, the key released and 500 answered
// (OversizeRefuse). With OversizeStoreHead the work commits, this client
// gets the full body and replays get the status and headers only, marked
// "Idempotent-Body-Omitted: true".
package httpidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// Middleware makes handlers idempotent per Idempotency-Key. It is safe for
// concurrent use; build one and wrap every route with Handler.
type Middleware struct {
	inbox       *dedupe.Inbox
	db          dedupe.DB // as given to New
	be          backend   // the database client: pgx or database/sql
	cfg         Config
	required    bool
	mode        Mode
	lockTimeout string // Config.LockTimeout as a setting
}

// pgxDB is what the middleware runs its transactions on over pgx: a pgx
// pool.
type pgxDB interface {
	dedupe.Querier
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// New returns a Middleware storing its keys through db: a *pgxpool.Pool,
// whose handlers get their transaction with Tx, or a database/sql handle
// wrapped with dedupe.SQL, whose handlers get theirs with SQLTx. The zero
// Config is the defaults. New does not touch the database; call Migrate
// once before serving.
func New(db dedupe.DB, cfg Config) (*Middleware, error) {
	if db == nil {
		return nil, &dedupe.ConfigError{Field: "db", Reason: "must not be nil"}
	}
	be, ok := newBackend(db)
	if !ok {
		return nil, &dedupe.ConfigError{Field: "db", Reason: fmt.Sprintf("httpidem needs a pgx pool or a database/sql handle wrapped with dedupe.SQL, not %T", db)}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	inbox, err := dedupe.New(db, c.Inbox)
	if err != nil {
		return nil, fmt.Errorf("httpidem: %w", err)
	}
	c.Inbox = inbox.Config()
	return &Middleware{inbox: inbox, db: db, be: be, cfg: c, required: c.KeyRequired, mode: c.Mode,
		lockTimeout: lockTimeoutSetting(c.LockTimeout)}, nil
}

// Migrate creates or upgrades the key table (Config.Inbox). It is
// idempotent and safe to run from many processes at once.
func (m *Middleware) Migrate(ctx context.Context) error {
	return dedupe.Migrate(ctx, m.db, m.cfg.Inbox.Migration())
}

// Inbox returns the inbox holding the keys, for operators (Lookup, Release,
// Stats).
func (m *Middleware) Inbox() *dedupe.Inbox { return m.inbox }

// Config returns the configuration with defaults filled in.
func (m *Middleware) Config() Config { return m.cfg }

// Required returns a Middleware sharing m's store whose routes refuse a
// request without a key (400).
func (m *Middleware) Required() *Middleware { c := *m; c.required = true; return &c }

// Optional returns a Middleware sharing m's store whose routes pass a
// request without a key straight through.
func (m *Middleware) Optional() *Middleware { c := *m; c.required = false; return &c }

// Leased returns a Middleware sharing m's store whose routes run in leased
// mode: for handlers with effects outside the database.
func (m *Middleware) Leased() *Middleware { c := *m; c.mode = Leased; return &c }

// Transactional returns a Middleware sharing m's store whose routes run in
// transactional mode.
func (m *Middleware) Transactional() *Middleware { c := *m; c.mode = Transactional; return &c }

// Handler wraps next. Requests whose method is not in Config.Methods pass
// straight through, and so do requests without a key on an optional route.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(m.cfg.Methods, r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, next)
	})
}

// HandlerFunc is Handler for a function.
func (m *Middleware) HandlerFunc(next http.HandlerFunc) http.Handler { return m.Handler(next) }

func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	m.cfg.ErrorHandler(w, r, err)
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	id, err := m.keyOf(r)
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	if id == "" {
		next.ServeHTTP(w, r)
		return
	}
	tenant, err := m.cfg.Tenant(r)
	if err != nil || tenant == "" {
		m.refuse(w, r, newError(http.StatusUnauthorized, ErrNoTenant, "", err))
		return
	}
	body, err := m.readBody(r)
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	key := dedupe.Key{Scope: tenant, ID: id, Fingerprint: m.cfg.Fingerprint(r, body)}
	ctx, observed := m.observe(r.Context(), r, key)
	if ctx != r.Context() { // without an Observer it is the same: no copy of r
		r = r.WithContext(ctx)
	}
	var (
		claim    *dedupe.Claim
		tx       reqTx
		reported bool
	)
	done := func(c *dedupe.Claim, err error) { reported = true; observed(c, err) }
	defer func() {
		if !reported { // a panic (an ErrorHandler's, say) before the request was settled
			observed(claim, errPanicBeforeSettled)
		}
	}()
	if m.mode == Transactional {
		tx, claim, err = m.claimTx(r.Context(), key)
	} else {
		claim, err = m.inbox.Begin(r.Context(), key)
	}
	if err != nil || claim.Outcome != dedupe.OutcomeClaimed {
		done(claim, err)
	}
	switch {
	case errors.Is(err, dedupe.ErrInvalidKey):
		// Only the tenant can be at fault here: the key was checked.
		m.refuse(w, r, newError(http.StatusUnauthorized, ErrNoTenant, "invalid tenant", err))
		return
	case errors.Is(err, dedupe.ErrInFlight):
		// A concurrent request held the key past the lock timeout.
		m.refuse(w, r, &Error{Status: http.StatusConflict, Err: ErrInFlight, Cause: err, RetryAfter: 1})
		return
	case err != nil:
		m.cfg.Logger.ErrorContext(r.Context(), "httpidem: claim failed", "key", key.String(), "err", err)
		m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrStore, Cause: err, RetryAfter: 1})
		return
	}
	switch claim.Outcome {
	case dedupe.OutcomeClaimed:
		settled, aborted := m.execute(w, r, next, claim, tx, body)
		done(claim, settled)
		if aborted {
			panic(http.ErrAbortHandler)
		}
	case dedupe.OutcomeDuplicate:
		replay(w, claim.Result)
	case dedupe.OutcomeInFlight:
		// The holder usually finishes soon; its lease bounds the wait.
		m.refuse(w, r, &Error{Status: http.StatusConflict, Err: ErrInFlight, RetryAfter: 1})
	case dedupe.OutcomeConflict:
		m.refuse(w, r, newError(http.StatusUnprocessableEntity, ErrKeyReused, "", nil))
	default: // dedupe.OutcomePoisoned
		m.refuse(w, r, newError(http.StatusUnprocessableEntity, ErrKeyFailed, "", nil))
	}
}

// errPanicBeforeSettled is what the Observer is told of a request whose
// serving panicked before its claim was settled.
var errPanicBeforeSettled = errors.New("httpidem: panic before the request was settled")

// keyOf returns the request's key, "" when it has none on an optional route,
// or an *Error.
func (m *Middleware) keyOf(r *http.Request) (string, error) {
	vals := r.Header.Values(m.cfg.Header)
	switch {
	case len(vals) > 1:
		return "", newError(http.StatusBadRequest, ErrKeyInvalid, "the header is repeated", nil)
	case len(vals) == 0 || vals[0] == "":
		if m.required {
			return "", newError(http.StatusBadRequest, ErrKeyMissing, "", nil)
		}
		return "", nil
	}
	return vals[0], ValidateKey(vals[0])
}

// readBody reads the whole body (bounded) and puts a replayable copy back.
func (m *Middleware) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxRequestBytes+1))
	_ = r.Body.Close()
	if err != nil {
		return nil, newError(http.StatusBadRequest, ErrBodyUnreadable, "", err)
	}
	if int64(len(body)) > m.cfg.MaxRequestBytes {
		return nil, newError(http.StatusRequestEntityTooLarge, ErrRequestTooLarge,
			fmt.Sprintf("over %d bytes", m.cfg.MaxRequestBytes), nil)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return body, nil
}

// replay answers a stored result.
func replay(w http.ResponseWriter, res *dedupe.Result) {
	h := w.Header()
	for k, v := range res.Headers {
		h[k] = v
	}
	h.Set(ReplayedHeader, "true")
	h.Set("Content-Length", strconv.Itoa(len(res.Body)))
	status := res.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(res.Body)
}

// execute runs the handler for a claimed key and settles the claim. tx is
// the request transaction holding the claim in transactional mode, nil in
// leased mode. It returns the error the claim was settled with (nil when the
// response was stored) and whether the handler aborted the response (the
// caller then panics with http.ErrAbortHandler, as net/http expects).
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, claim *dedupe.Claim, tx reqTx, body []byte) (settled error, aborted bool) {
	req := &request{db: m.be, claim: claim, txOpts: m.cfg.TxOptions, tx: tx}
	ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), requestKey{}, req), m.cfg.Inbox.Lease)
	defer cancel()
	rec := newRecorder(ctx, m.cfg.MaxResponseBytes, m.cfg.Oversize == OversizeStoreHead)
	r = r.WithContext(ctx)
	r.Body = io.NopCloser(bytes.NewReader(body))

	panicked, aborted := m.run(rec, r, next)
	late := rec.finish()
	s := m.newSettlement(r.Context(), claim, req.finish())
	defer s.cancel()

	if !m.settle(s, w, r, rec, panicked, aborted, late) {
		// Over database/sql, the handler's end of the transaction shows
		// only on the middleware's next statement: nothing was answered.
		s.ended(w, r)
	}
	return s.err, aborted
}

// settle settles the claim after the handler returned and answers. It
// returns false, having answered nothing, when the request transaction turns
// out to have been ended by the handler (over database/sql, from the
// middleware's next statement in it); the caller then settles it as ended.
func (m *Middleware) settle(s *settlement, w http.ResponseWriter, r *http.Request, rec *recorder,
	panicked error, aborted, late bool) bool {
	ctx := r.Context() // the handler's
	switch {
	case s.status == txEnded || s.status == txBroken:
		// Ended behind the middleware's back: what it committed, if
		// anything, is not known from here.
		s.ended(w, r)
		return true
	case aborted:
		// The handler asked net/http to abort the connection: no answer
		// reaches the client, so nothing is stored and a retry executes.
		return s.abandon(errors.New("handler aborted the response"))
	case panicked != nil:
		rec = newRecorder(ctx, m.cfg.MaxResponseBytes, false)
		WriteError(rec, r, panicked)
		return s.serverError(w, rec, panicked, late || ctx.Err() != nil)
	case late:
		// The handler returned after its context ended (the client went
		// away, or the lease ran out): its work may have been cut short,
		// and whatever it answered is an artefact of the cancellation, not
		// the operation's answer. Rolled back and not stored; the retry
		// executes. A success is never answered for work rolled back.
		if !s.abandon(context.Cause(ctx)) {
			return false
		}
		s.logger().InfoContext(s.ctx, "httpidem: the handler returned after the request context ended; its work was rolled back, not stored, key released",
			"status", rec.statusCode(), "cause", context.Cause(ctx))
		if rec.statusCode() >= 400 && rec.failed == 0 {
			rec.writeTo(w) // an error, as it is: nothing to take back
			return true
		}
		m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrRolledBack, RetryAfter: 1,
			Detail: "the request's context ended before its handler returned; nothing was committed", Cause: context.Cause(ctx)})
		return true
	case rec.failed != 0:
		// The handler wrote an error status after a success status: it
		// failed after it had begun to answer. Neither status is an answer
		// to store; its work is rolled back and the key released.
		cause := fmt.Errorf("handler answered %d after %d", rec.failed, rec.statusCode())
		if !s.abandon(cause) {
			return false
		}
		s.logger().WarnContext(s.ctx, "httpidem: the handler answered an error after a success status; its work was rolled back, key released",
			"status", rec.statusCode(), "then", rec.failed)
		m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrRolledBack, RetryAfter: 1,
			Detail: "the handler failed after it had begun to answer; nothing was committed", Cause: cause})
		return true
	case rec.statusCode() >= 500:
		return s.serverError(w, rec, fmt.Errorf("handler answered %d", rec.statusCode()), ctx.Err() != nil)
	case s.status == txAborted:
		// A statement failed and the handler answered as if it had not:
		// its transaction cannot commit. Answered as a 500 of the handler.
		rec = newRecorder(ctx, m.cfg.MaxResponseBytes, false)
		err := newError(http.StatusInternalServerError, ErrTxEnded, "a statement of the request failed and its transaction was aborted", nil)
		WriteError(rec, r, err)
		return s.serverError(w, rec, err, false)
	case rec.oversize && m.cfg.Oversize == OversizeRefuse:
		if !s.abandon(ErrResponseTooLarge) {
			return false
		}
		m.refuse(w, r, newError(http.StatusInternalServerError, ErrResponseTooLarge,
			fmt.Sprintf("the response is over %d bytes; its work was rolled back", m.cfg.MaxResponseBytes), nil))
		return true
	default:
		return s.complete(w, r, rec)
	}
}

// run calls the handler and returns a *PanicError-wrapping *Error if it
// panicked, or aborted when it panicked with http.ErrAbortHandler.
func (m *Middleware) run(rec *recorder, r *http.Request, next http.Handler) (panicked error, aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				aborted = true
				return
			}
			pe := &dedupe.PanicError{Value: v, Stack: debug.Stack()}
			m.cfg.Logger.ErrorContext(r.Context(), "httpidem: handler panicked", "panic", fmt.Sprint(v), "stack", string(pe.Stack))
			panicked = newError(http.StatusInternalServerError, ErrPanic, "internal error", pe)
		}
	}()
	next.ServeHTTP(rec, r)
	return nil, false
}
