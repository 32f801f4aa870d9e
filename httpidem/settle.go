package httpidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/exactlyonce/dedupe"

	"github.com/exactlyonce/dedupe/internal/pgerr"
)

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
	transactional bool // the claim is in tx
	// idle: over database/sql, the handler ended the transaction and began
	// none, so that its later statements may have committed on their own.
	idle bool
	log  *slog.Logger // built by logger when first needed
	err  error        // for the Observer: why the key was not settled with a stored answer (nil when it was)
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
	s.idle = s.m.be.isSQL() && noTxOpen(err)
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
		rec := newRecorder(context.Background(), m.cfg.MaxResponseBytes, false)
		WriteError(rec, r, endedErr)
		s.logger().ErrorContext(s.ctx, "httpidem: the handler ended the request transaction itself")
		s.serverError(w, rec, endedErr, false) // with no tx: always answers
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
	case s.idle:
		// The claim went with the handler's ROLLBACK, but the statements
		// it sent after it ran outside any transaction, over database/sql,
		// and may have committed: the key answers 500 from now on, so that
		// they run at most once.
		s.logger().ErrorContext(s.ctx, "httpidem: the handler rolled the request transaction back itself and wrote on outside it; the key answers 500 from now on")
		rec := newRecorder(context.Background(), m.cfg.MaxResponseBytes, false)
		WriteError(rec, r, endedErr)
		if err := s.storeAgain(rec.result(m.cfg.StoredHeaders)); err != nil {
			s.logger().ErrorContext(s.ctx, "httpidem: storing the error response failed", "err", err)
		}
		rec.writeTo(w)
	default:
		s.logger().ErrorContext(s.ctx, "httpidem: the handler rolled the request transaction back itself; nothing committed")
		m.refuse(w, r, endedErr)
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
