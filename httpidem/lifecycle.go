package httpidem

// One idempotent request, top to bottom. Middleware.Handler hands a request
// of a method it applies to to serve, which
//
//  1. reads the key, the tenant and the body (keyOf, readBody), refusing a
//     request that cannot be tied to a key before anything is recorded;
//  2. claims the key: in transactional mode inside the request transaction
//     (claimTx, through the backend's claimOnce), in leased mode on its own
//     (Inbox.Begin);
//  3. answers a key it did not claim: the stored result (replay), 409, 422;
//  4. runs the handler on a claimed key (execute, run), its response
//     buffered (recorder) and its context bounded by the lease;
//  5. settles the claim (settle): stores the response and commits
//     (complete), stores an error answer with the effects rolled back
//     (serverError), rolls back and releases the key (abandon), or settles
//     a transaction the handler ended behind the middleware's back (ended);
//     a COMMIT whose reply was lost is resolved (commitTx, resolveCommit);
//  6. answers the client only then.
//
// Below this file: the backends that run the statements (backend.go: pgx
// and database/sql, the request transaction reqTx; pipelinedtx.go: the
// transactional claim pipelined with BEGIN over pgx), the response buffer
// (recorder.go) and the Observer's report (observe.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/pgerr"
)

// serve is one request's lifecycle, steps 1 to 3 here and 4 to 6 in
// execute: see the file's comment.
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

func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	m.cfg.ErrorHandler(w, r, err)
}

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

// claimRetries is how often a transactional claim aborted by a
// serialization failure or a deadlock is tried again.
const claimRetries = 3

// claimTx begins the request's transaction and claims key in it
// (transactional mode), through the backend: over pgx, BEGIN, the lock
// timeout, the claim's insert, the lock timeout's reset and the savepoint go
// to the server in one round trip (pipelinedTx), with the read of an
// existing key while the inbox met duplicates recently (after a run of new
// keys a key found taken is read in a second round trip: Inbox.Claim); over
// database/sql one after the other. A concurrent
// request holding the key makes the claim fail with dedupe.ErrInFlight
// after Config.LockTimeout.
//
// For OutcomeClaimed it returns the open transaction, with the claim's
// savepoint taken after the claim (StoreServerErrors rolls the handler's
// effects back to it; the middleware releases it before it commits, proof
// that the transaction is still the request's); for any other outcome, and
// on error, the transaction is already rolled back and tx is nil.
func (m *Middleware) claimTx(ctx context.Context, key dedupe.Key) (tx reqTx, claim *dedupe.Claim, err error) {
	for try := 0; ; try++ {
		tx, claim, err = m.be.claimOnce(ctx, m, key)
		if err == nil && tx != nil {
			return tx, claim, nil
		}
		if err == nil || !errors.Is(err, dedupe.ErrRetryable) || try == claimRetries || ctx.Err() != nil {
			return nil, claim, err
		}
	}
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

// settleTimeout bounds the statements that settle a claim after the handler
// returned. They run even when the client went away, or the key would stay
// held.
const settleTimeout = 10 * time.Second

// txState is the state of the request transaction when the handler returned.
type txState int

const (
	txNone    txState = iota // leased mode, and the handler opened none
	txOpen                   // open and healthy
	txAborted                // a statement failed: it can only roll back
	txEnded                  // ended behind the middleware's back
	txBroken                 // its connection is gone
)

// settlement settles one claimed request after its handler returned: it
// commits or rolls back the request transaction, stores the response or
// releases the key, and answers.
type settlement struct {
	m             *Middleware
	ctx           context.Context
	cancel        context.CancelFunc
	claim         *dedupe.Claim
	tx            reqTx // the request transaction, nil if none
	status        txState
	transactional bool         // the claim is in tx
	log           *slog.Logger // built by logger when first needed
	err           error        // for the Observer: why the key was not settled with a stored answer (nil when it was)
}

func (m *Middleware) newSettlement(rctx context.Context, claim *dedupe.Claim, tx reqTx) *settlement {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rctx), settleTimeout)
	s := &settlement{m: m, ctx: ctx, cancel: cancel, claim: claim, transactional: m.mode == Transactional}
	if tx != nil {
		s.status = tx.state()
		tx.end()
		s.tx = tx
	}
	return s
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

// complete stores the handler's response with the claim and commits, then
// answers it. It returns false, having answered nothing, when the request
// transaction turns out to have been ended by the handler (endedBehind).
func (s *settlement) complete(w http.ResponseWriter, r *http.Request, rec *recorder) bool {
	m := s.m
	res := rec.result(m.cfg.StoredHeaders)
	var err error
	switch {
	case s.transactional:
		err = s.tx.commitStored(s.ctx, m, s.claim, res, false)
	case s.tx != nil:
		err = m.commitAfter(s.ctx, s.tx, s.claim, func() error { return m.inbox.CompleteTx(s.ctx, s.tx.querier(), s.claim, res) })
	default:
		err = m.inbox.Complete(s.ctx, s.claim, res)
	}
	if s.endedBehind(err) {
		return false
	}
	s.err = err
	switch {
	case err == nil:
		rec.writeTo(w)
	case errors.Is(err, dedupe.ErrLeaseLost):
		s.logger().WarnContext(s.ctx, "httpidem: lease lost; work rolled back", "err", err)
		m.refuse(w, r, newError(http.StatusConflict, ErrLeaseLost, "", err))
	case errors.Is(err, dedupe.ErrOutcomeUnknown):
		s.logger().ErrorContext(s.ctx, "httpidem: the reply to the request's commit was lost and its outcome could not be learnt", "err", err)
		s.releaseLeased(err)
		m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrOutcomeUnknown, Cause: err, RetryAfter: 1})
	default:
		s.logger().ErrorContext(s.ctx, "httpidem: storing the response failed; nothing committed", "err", err)
		s.releaseLeased(err)
		m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrStore, Detail: "nothing was committed", Cause: err, RetryAfter: 1})
	}
	return true
}

// serverError settles a 5xx answer, a panic or an aborted transaction, rec
// holding the answer: the handler's effects roll back and, under
// StoreServerErrors, the answer is stored with the key; under
// RetryServerErrors, or when the request's context had ended (the error is
// an artefact of the cancellation), the key is released. The answer is sent
// either way. It returns false, having answered nothing, when the request
// transaction turns out to have been ended by the handler (endedBehind).
func (s *settlement) serverError(w http.ResponseWriter, rec *recorder, cause error, canceled bool) bool {
	m := s.m
	if canceled || m.cfg.ServerErrors == RetryServerErrors {
		if !s.abandon(cause) {
			return false
		}
		rec.writeTo(w)
		return true
	}
	res := rec.result(m.cfg.StoredHeaders)
	var err error
	if s.transactional {
		// Back to the savepoint after the claim: the effects go, the claim
		// stays held, so no concurrent duplicate runs the handler again.
		err = s.tx.commitStored(s.ctx, m, s.claim, res, true)
		if s.endedBehind(err) {
			return false
		}
	} else {
		if s.endedBehind(rollback(s.ctx, s.tx)) {
			return false
		}
		err = m.inbox.Complete(s.ctx, s.claim, res)
		if err != nil && !errors.Is(err, dedupe.ErrLeaseLost) {
			s.releaseLeased(cause)
		}
	}
	s.err = err // nil: the error answer is stored as the key's final answer
	switch {
	case err == nil:
	case errors.Is(err, dedupe.ErrOutcomeUnknown):
		s.logger().ErrorContext(s.ctx, "httpidem: the reply to the commit of the error response was lost and its outcome could not be learnt", "err", err)
	default:
		s.logger().ErrorContext(s.ctx, "httpidem: storing the error response failed", "err", err)
	}
	rec.writeTo(w)
	return true
}

// abandon rolls the request's work back and frees the key, so that a retry
// executes again. It returns false, having done nothing, when the request
// transaction turns out to have been ended by the handler (endedBehind).
func (s *settlement) abandon(cause error) bool {
	// In transactional mode, the claim goes with the rollback.
	if s.endedBehind(rollback(s.ctx, s.tx)) {
		return false
	}
	s.err = cause
	s.releaseLeased(cause)
	return true
}

// ended settles a request whose transaction ended behind the middleware's
// back (a COMMIT or ROLLBACK sent as a statement) or whose connection broke.
// In transactional mode the claim went with the transaction, committed or
// not: a fresh connection tells which. A committed claim gets the 500 stored
// (its effects, whatever they were, committed with it, so the key is not
// released); otherwise the key is free again.
func (s *settlement) ended(w http.ResponseWriter, r *http.Request) {
	m := s.m
	rollback(s.ctx, s.tx) //nolint:errcheck // frees the connection
	s.tx = nil            // over: nothing more runs in it
	broken := s.status == txBroken
	endedErr := newError(http.StatusInternalServerError, ErrTxEnded, "the request transaction was ended behind the middleware's back", nil)
	s.err = endedErr
	if !s.transactional {
		if broken {
			s.logger().ErrorContext(s.ctx, "httpidem: the request transaction's connection was lost; nothing committed")
			s.releaseLeased(errors.New("connection lost"))
			m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrStore, Detail: "nothing was committed", RetryAfter: 1})
			return
		}
		// What the handler wrote after the end (the rest of the statement
		// that ended the transaction, a transaction it began and committed
		// itself; over database/sql any later statement) may have committed
		// on its own: the key answers 500 from now on, whatever
		// Config.ServerErrors says, so that it runs at most once.
		rec := newRecorder(context.Background(), m.cfg.MaxResponseBytes, false)
		WriteError(rec, r, endedErr)
		s.logger().ErrorContext(s.ctx, "httpidem: the handler ended the request transaction itself; the key answers 500 from now on")
		if err := m.inbox.Complete(s.ctx, s.claim, rec.result(m.cfg.StoredHeaders)); err != nil && !errors.Is(err, dedupe.ErrLeaseLost) {
			s.logger().ErrorContext(s.ctx, "httpidem: storing the error response failed", "err", err)
			s.releaseLeased(endedErr)
		}
		rec.writeTo(w)
		return
	}
	committed, err := m.inbox.Resolve(s.ctx, s.claim)
	switch {
	case err != nil:
		s.err = err // matches dedupe.ErrOutcomeUnknown
		s.logger().ErrorContext(s.ctx, "httpidem: the request transaction ended and whether it committed could not be learnt", "err", err)
		m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrOutcomeUnknown, Cause: err, RetryAfter: 1})
	case committed:
		s.err = nil // settled: the key holds the 500 from now on
		s.logger().ErrorContext(s.ctx, "httpidem: the handler committed the request transaction itself; the key answers 500 from now on")
		rec := newRecorder(context.Background(), m.cfg.MaxResponseBytes, false)
		WriteError(rec, r, endedErr)
		if err := m.inbox.StoreResultTx(s.ctx, m.db, s.claim, rec.result(m.cfg.StoredHeaders)); err != nil {
			s.logger().ErrorContext(s.ctx, "httpidem: storing the error response failed", "err", err)
		}
		rec.writeTo(w)
	case broken:
		s.logger().ErrorContext(s.ctx, "httpidem: the request transaction's connection was lost; nothing committed")
		m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrStore, Detail: "nothing was committed", RetryAfter: 1})
	default:
		// The claim went with the handler's ROLLBACK, but what it wrote
		// after it may have committed on its own: the rest of the
		// statement that ended the transaction ("ROLLBACK; INSERT ...",
		// which no guard sees between the two), a transaction it began
		// and committed itself, and over database/sql any later statement.
		// The key answers 500 from now on, so that it runs at most once
		// (as a Consumer marks such a key failed).
		s.logger().ErrorContext(s.ctx, "httpidem: the handler rolled the request transaction back itself; the key answers 500 from now on")
		rec := newRecorder(context.Background(), m.cfg.MaxResponseBytes, false)
		WriteError(rec, r, endedErr)
		if err := s.storeAgain(rec.result(m.cfg.StoredHeaders)); err != nil {
			s.logger().ErrorContext(s.ctx, "httpidem: storing the error response failed", "err", err)
		}
		rec.writeTo(w)
	}
}

// storeAgain claims the key of a transactional request whose claim was
// rolled back and stores res as its answer (a leased claim completed at
// once). A key a concurrent retry claimed meanwhile is left to it.
func (s *settlement) storeAgain(res dedupe.Result) error {
	c, err := s.m.inbox.Begin(s.ctx, s.claim.Key)
	if err != nil || c.Outcome != dedupe.OutcomeClaimed {
		return err
	}
	return s.m.inbox.Complete(s.ctx, c, res)
}

// releaseLeased frees a leased claim at once. Fail is fenced by the claim's
// token and state, so it never releases a key that a lost commit did
// complete.
func (s *settlement) releaseLeased(cause error) {
	if s.transactional {
		return
	}
	if _, err := s.m.inbox.Fail(s.ctx, s.claim, cause); err != nil && !errors.Is(err, dedupe.ErrLeaseLost) {
		s.logger().ErrorContext(s.ctx, "httpidem: releasing the key failed; it is held until its lease ends", "err", err)
	}
}

// endedBehind reports whether err, returned for one of the middleware's
// own statements in the request transaction, shows that the handler ended
// the transaction itself (database/sql, where that is not known before);
// the request is then settled as ended (see execute), with nothing written
// to the client yet.
func (s *settlement) endedBehind(err error) bool {
	if err == nil || s.tx == nil || !s.tx.endedBehind(err) {
		return false
	}
	s.status = txEnded
	return true
}

// logger returns the settlement's logger, with the key and the mode. It is
// built on first use: a request settled without a word logs nothing.
func (s *settlement) logger() *slog.Logger {
	if s.log == nil {
		s.log = s.m.cfg.Logger.With("key", s.claim.Key.String(), "mode", s.m.mode.String())
	}
	return s.log
}

// commitAfter proves that tx is still the request's (checkClaim), runs
// store in it and commits (commitTx), or rolls tx back and returns the
// check's or store's error.
func (m *Middleware) commitAfter(ctx context.Context, tx reqTx, claim *dedupe.Claim, store func() error) error {
	if err := tx.checkClaim(ctx); err != nil {
		rollback(ctx, tx)
		return err
	}
	if err := store(); err != nil {
		rollback(ctx, tx)
		return err
	}
	return m.commitTx(ctx, tx, claim)
}

// commitTx commits tx, which holds the completion of claim. A COMMIT whose
// reply was lost is not a rollback: it is resolved on a fresh connection
// (Inbox.Resolve). It returns nil when the transaction committed, an error
// matching dedupe.ErrOutcomeUnknown when that cannot be learnt, and any
// other error when it did not commit.
func (m *Middleware) commitTx(ctx context.Context, tx reqTx, claim *dedupe.Claim) error {
	return m.resolveCommit(ctx, claim, tx.commit(ctx))
}

// resolveCommit returns what commitTx returns for err, what the COMMIT of
// claim's transaction (or the round trip that carried it) returned.
func (m *Middleware) resolveCommit(ctx context.Context, claim *dedupe.Claim, err error) error {
	if err == nil {
		return nil
	}
	if !mayHaveApplied(err) {
		return fmt.Errorf("httpidem: commit: %w", err)
	}
	committed, rerr := m.inbox.Resolve(ctx, claim)
	switch {
	case rerr != nil:
		return &dedupe.OutcomeUnknownError{Op: "commit", Key: claim.Key, Err: errors.Join(err, rerr)}
	case committed:
		m.cfg.Logger.WarnContext(ctx, "httpidem: the reply to the request's commit was lost; it committed",
			"key", claim.Key.String(), "err", err)
		return nil
	}
	return fmt.Errorf("httpidem: commit failed and did not take effect: %w", err)
}

// mayHaveApplied reports whether err, returned by a COMMIT, leaves it
// unknown whether the server applied it (the rule the core uses too).
func mayHaveApplied(err error) bool { return pgerr.MayHaveApplied(err) }
