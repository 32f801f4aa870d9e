// Package httpidem is the Idempotency-Key layer for HTTP APIs, on top of
// dedupe's leased mode: net/http middleware for the server, a retrying
// http.RoundTripper for the client, and ETag/If-Match helpers for
// optimistic concurrency.
//
// The middleware claims (tenant, Idempotency-Key) atomically before the
// handler runs. A concurrent request with the same key gets 409 (nothing
// recorded, retry later), the same key with a different request 422, and a
// completed key the stored status, headers and body with
// "Idempotent-Replayed: true". A handler that writes through Tx(ctx) has its
// business rows and the stored response committed in one transaction; a 5xx
// answer or a panic rolls its work back and stores the error response (see
// ServerErrorPolicy). Responses are buffered and sent only after the commit.
// In-flight keys hold a lease (90 s by default) so a process that died
// mid-request does not block the key forever; keys are kept 24 h by default
// and purged with Middleware.Purge or Middleware.RunPurger.
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
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// Middleware makes handlers idempotent per Idempotency-Key. It is safe for
// concurrent use; build one and wrap every route with Handler.
type Middleware struct {
	inbox    *dedupe.Inbox
	db       dedupe.DB
	cfg      Config
	required bool
}

// New returns a Middleware storing its keys through db (a *pgxpool.Pool).
// cfg may be nil for the defaults. New does not touch the database; call
// Migrate once before serving.
func New(db dedupe.DB, cfg *Config) (*Middleware, error) {
	if db == nil {
		return nil, &ConfigError{Field: "db", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	inbox, err := dedupe.New(db, &c.Inbox)
	if err != nil {
		return nil, fmt.Errorf("httpidem: %w", err)
	}
	c.Inbox = inbox.Config()
	return &Middleware{inbox: inbox, db: db, cfg: c, required: c.KeyRequired}, nil
}

// Migrate creates or upgrades the key table (Config.Inbox). It is
// idempotent and safe to run from many processes at once.
func (m *Middleware) Migrate(ctx context.Context) error {
	return dedupe.Migrate(ctx, m.db, &m.cfg.Inbox, dedupe.LineInbox)
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
	claim, err := m.inbox.Begin(r.Context(), key)
	if err != nil {
		if errors.Is(err, dedupe.ErrInvalidKey) {
			// Only the tenant can be at fault here: the key was checked.
			m.refuse(w, r, newError(http.StatusUnauthorized, ErrNoTenant, "invalid tenant", err))
			return
		}
		m.cfg.Logger.ErrorContext(r.Context(), "httpidem: claim failed", "key", key.String(), "err", err)
		m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrStore, Cause: err, RetryAfter: 1})
		return
	}
	switch claim.Outcome {
	case dedupe.OutcomeClaimed:
		m.execute(w, r, next, claim, body)
	case dedupe.OutcomeDuplicate:
		replay(w, claim.Result)
	case dedupe.OutcomeInFlight:
		e := newError(http.StatusConflict, ErrInFlight, "", nil)
		e.RetryAfter = 1 // the holder usually finishes soon; the lease bounds the wait
		m.refuse(w, r, e)
	case dedupe.OutcomeConflict:
		m.refuse(w, r, newError(http.StatusUnprocessableEntity, ErrKeyReused, "", nil))
	default: // dedupe.OutcomePoisoned
		m.refuse(w, r, newError(http.StatusUnprocessableEntity, ErrKeyFailed, "", nil))
	}
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

// execute runs the handler for a claimed key and settles the claim.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, claim *dedupe.Claim, body []byte) {
	req := &request{db: m.db, claim: claim, txOpts: m.cfg.TxOptions}
	ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), requestKey{}, req), m.cfg.Inbox.Lease)
	defer cancel()
	rec := newRecorder(m.cfg.MaxResponseBytes, m.cfg.Oversize == OversizeStoreHead)
	r = r.WithContext(ctx)
	r.Body = io.NopCloser(bytes.NewReader(body))

	panicked, aborted := m.run(rec, r, next)
	tx := req.takeTx()
	// Settling must finish even when the client went away, or the key would
	// stay in flight until its lease ends.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer scancel()
	log := m.cfg.Logger.With("key", claim.Key.String())

	switch {
	case aborted:
		// The handler asked net/http to abort the connection: no answer
		// reaches the client, so nothing is stored and a retry executes.
		rollback(sctx, tx)
		m.release(sctx, claim, errors.New("handler aborted the response"), log)
		panic(http.ErrAbortHandler)
	case panicked != nil:
		rollback(sctx, tx)
		rec = newRecorder(m.cfg.MaxResponseBytes, false)
		WriteError(rec, r, panicked)
		m.settleError(sctx, w, ctx.Err() != nil, claim, rec, panicked, log)
	case rec.statusCode() >= 500:
		rollback(sctx, tx)
		m.settleError(sctx, w, ctx.Err() != nil, claim, rec, fmt.Errorf("handler answered %d", rec.statusCode()), log)
	case rec.oversize && m.cfg.Oversize == OversizeRefuse:
		rollback(sctx, tx)
		m.release(sctx, claim, ErrResponseTooLarge, log)
		m.refuse(w, r, newError(http.StatusInternalServerError, ErrResponseTooLarge,
			fmt.Sprintf("the response is over %d bytes; its work was rolled back", m.cfg.MaxResponseBytes), nil))
	default:
		if err := m.commit(sctx, tx, claim, rec.result(m.cfg.StoredHeaders)); err != nil {
			if errors.Is(err, dedupe.ErrLeaseLost) {
				log.WarnContext(sctx, "httpidem: lease lost; work rolled back", "err", err)
				m.refuse(w, r, newError(http.StatusConflict, ErrLeaseLost, "", err))
				return
			}
			log.ErrorContext(sctx, "httpidem: commit failed; work rolled back", "err", err)
			m.release(sctx, claim, err, log)
			m.refuse(w, r, &Error{Status: http.StatusServiceUnavailable, Err: ErrStore, Cause: err, RetryAfter: 1})
			return
		}
		rec.writeTo(w)
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

// commit stores the result with the handler's work (in its transaction, if
// it opened one) and commits.
func (m *Middleware) commit(ctx context.Context, tx pgx.Tx, claim *dedupe.Claim, res dedupe.Result) error {
	if tx == nil {
		return m.inbox.Complete(ctx, claim, res)
	}
	if err := m.inbox.CompleteTx(ctx, tx, claim, res); err != nil {
		rollback(ctx, tx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("httpidem: commit: %w", err)
	}
	return nil
}

// settleError handles a 5xx answer or a panic after the rollback: store the
// error response (StoreServerErrors) or release the key. When the request's
// context ended first (the client went away, or the lease ran out) the error
// is an artefact of the cancellation, not the handler's answer: the key is
// released so that the retry executes.
func (m *Middleware) settleError(ctx context.Context, w http.ResponseWriter, canceled bool, claim *dedupe.Claim, rec *recorder, cause error, log *slog.Logger) {
	if m.cfg.ServerErrors == RetryServerErrors || canceled {
		m.release(ctx, claim, cause, log)
		rec.writeTo(w)
		return
	}
	if err := m.inbox.Complete(ctx, claim, rec.result(m.cfg.StoredHeaders)); err != nil {
		log.ErrorContext(ctx, "httpidem: storing the error response failed", "err", err)
		if !errors.Is(err, dedupe.ErrLeaseLost) {
			m.release(ctx, claim, cause, log)
		}
	}
	rec.writeTo(w)
}

// release frees the key at once so that a retry executes again.
func (m *Middleware) release(ctx context.Context, claim *dedupe.Claim, cause error, log *slog.Logger) {
	if _, err := m.inbox.Fail(ctx, claim, cause); err != nil && !errors.Is(err, dedupe.ErrLeaseLost) {
		log.ErrorContext(ctx, "httpidem: releasing the key failed; it is held until its lease ends", "err", err)
	}
}

func rollback(ctx context.Context, tx pgx.Tx) {
	if tx != nil {
		_ = tx.Rollback(ctx)
	}
}
