package httpidem

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Sentinel errors. Every refusal of the middleware and the ETag helpers
// matches one of them with errors.Is, and StatusCode maps each to its HTTP
// status. The *Error type carries the status and the detail.
var (
	// ErrKeyMissing (400): the route requires an Idempotency-Key and the
	// request has none. Nothing is recorded; the client may retry with a key.
	ErrKeyMissing = errors.New("httpidem: Idempotency-Key header is required")
	// ErrKeyInvalid (400): the key is longer than MaxKeyLen characters, is
	// not printable ASCII, or the header is repeated.
	ErrKeyInvalid = errors.New("httpidem: Idempotency-Key is invalid")
	// ErrNoTenant (401): Config.Tenant found no tenant for the request.
	ErrNoTenant = errors.New("httpidem: no tenant for the request")
	// ErrBodyUnreadable (400): reading the request body failed.
	ErrBodyUnreadable = errors.New("httpidem: request body could not be read")
	// ErrRequestTooLarge (413): the body is over Config.MaxRequestBytes.
	ErrRequestTooLarge = errors.New("httpidem: request body too large")
	// ErrInFlight (409): a request with the same key is still being
	// processed (in transactional mode: it did not finish within
	// Config.LockTimeout). Nothing is recorded against the key; retry later.
	ErrInFlight = errors.New("httpidem: a request with this Idempotency-Key is in flight")
	// ErrKeyReused (422): the key was used before with a different request
	// (method, path or body). This is a client bug: use a new key.
	ErrKeyReused = errors.New("httpidem: Idempotency-Key reused with a different request")
	// ErrKeyFailed (422): the key is marked failed (its attempts are used
	// up, see dedupe.Config.MaxAttempts) and is no longer retried.
	ErrKeyFailed = errors.New("httpidem: Idempotency-Key is marked failed")
	// ErrLeaseLost (409): the request ran longer than the lease and another
	// attempt took the key over; this attempt's work was rolled back.
	ErrLeaseLost = errors.New("httpidem: lease on the Idempotency-Key was lost")
	// ErrResponseTooLarge (500): under OversizeRefuse, the handler's
	// response was over Config.MaxResponseBytes; its transaction was rolled
	// back and the key released.
	ErrResponseTooLarge = errors.New("httpidem: response too large to store")
	// ErrPanic (500): the handler panicked.
	ErrPanic = errors.New("httpidem: handler panicked")
	// ErrStore (503): the idempotency store (PostgreSQL) failed. Nothing is
	// recorded against the key; retry later.
	ErrStore = errors.New("httpidem: idempotency store unavailable")
	// ErrOutcomeUnknown (503): the connection broke after the request's
	// COMMIT was sent, and the middleware could not learn on a fresh
	// connection whether it committed. It never means "rolled back": retry
	// with the same key, and a committed request answers with its stored
	// response. It matches dedupe.ErrOutcomeUnknown.
	ErrOutcomeUnknown = errors.New("httpidem: the request may or may not have been committed; retry with the same key")
	// ErrRolledBack (503, with Retry-After): the handler's work was rolled
	// back and nothing was stored with the key, although the handler may
	// have answered a success: its context ended before it returned (the
	// client went away, or it ran past Config.Inbox.Lease, see Config), or
	// it wrote an error status after a success status (it failed after it
	// had begun to answer). The key is free: retry with the same key, and
	// the operation executes again.
	ErrRolledBack = errors.New("httpidem: the request's work was rolled back; retry with the same key")
	// ErrTxManaged: a handler called Commit or Rollback on the transaction
	// from Tx; the middleware ends it. The refusal matches
	// dedupe.ErrTxOwned too.
	ErrTxManaged = errors.New("httpidem: the request transaction is ended by the middleware")
	// ErrTxEnded (500): the request transaction was ended behind the
	// middleware's back (a COMMIT or ROLLBACK sent as a statement, or
	// through Conn()) or aborted by a failed statement whose error the
	// handler ignored. Statements sent through Tx after the end are refused
	// with it instead of running outside any transaction, and the request
	// is answered as if the handler had answered 500. The refusal matches
	// dedupe.ErrTxEnded too.
	ErrTxEnded = errors.New("httpidem: the request transaction was ended or aborted behind the middleware's back")
	// ErrNoTx: Tx was called outside a request handled by the middleware.
	ErrNoTx = errors.New("httpidem: no idempotent request in context")
	// ErrWrongDriver: Tx was called over a middleware built on
	// database/sql, or SQLTx over one built on a pgx pool.
	ErrWrongDriver = errors.New("httpidem: the request transaction is of the other database driver")

	// ErrPreconditionRequired (428): the update needs an If-Match header.
	ErrPreconditionRequired = errors.New("httpidem: If-Match header is required")
	// ErrPreconditionFailed (412): If-Match names a stale version.
	ErrPreconditionFailed = errors.New("httpidem: If-Match does not match the current version")
	// ErrNotFound (404): the versioned row does not exist.
	ErrNotFound = errors.New("httpidem: not found")

	// ErrGaveUp is matched by every *GiveUpError: the retrying client used
	// up its attempts.
	ErrGaveUp = errors.New("httpidem: gave up after retries")
)

// Error is a refusal with its HTTP status. It matches its sentinel (Err)
// with errors.Is and wraps the cause, if any.
type Error struct {
	Status int    // the HTTP status answered
	Err    error  // the sentinel
	Detail string // a human-readable explanation for the problem body
	Cause  error  // the underlying error, if any
	// RetryAfter, when positive, is sent as the Retry-After header (seconds).
	RetryAfter int
}

// Error implements the error interface.
func (e *Error) Error() string {
	msg := e.Err.Error()
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Unwrap returns the sentinel and the cause.
func (e *Error) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Err, e.Cause}
	}
	return []error{e.Err}
}

func newError(status int, sentinel error, detail string, cause error) *Error {
	return &Error{Status: status, Err: sentinel, Detail: detail, Cause: cause}
}

// StatusCode returns the HTTP status for err: the status of an *Error, the
// status of a known sentinel, and 500 for anything else.
func StatusCode(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	for _, s := range statusOf {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return http.StatusInternalServerError
}

var statusOf = []struct {
	err    error
	status int
}{
	{ErrKeyMissing, http.StatusBadRequest},
	{ErrKeyInvalid, http.StatusBadRequest},
	{ErrNoTenant, http.StatusUnauthorized},
	{ErrBodyUnreadable, http.StatusBadRequest},
	{ErrRequestTooLarge, http.StatusRequestEntityTooLarge},
	{ErrInFlight, http.StatusConflict},
	{ErrLeaseLost, http.StatusConflict},
	{ErrKeyReused, http.StatusUnprocessableEntity},
	{ErrKeyFailed, http.StatusUnprocessableEntity},
	{ErrStore, http.StatusServiceUnavailable},
	{ErrOutcomeUnknown, http.StatusServiceUnavailable},
	{ErrRolledBack, http.StatusServiceUnavailable},
	{ErrTxEnded, http.StatusInternalServerError},
	{ErrPreconditionRequired, http.StatusPreconditionRequired},
	{ErrPreconditionFailed, http.StatusPreconditionFailed},
	{ErrNotFound, http.StatusNotFound},
}

// Problem is the RFC 9457 problem document written for errors.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// WriteError answers err as an application/problem+json document with the
// status from StatusCode. It is the default Config.ErrorHandler and may be
// used by handlers for the ETag helpers' errors.
func WriteError(w http.ResponseWriter, _ *http.Request, err error) {
	status := StatusCode(err)
	p := Problem{Type: "about:blank", Title: http.StatusText(status), Status: status}
	var e *Error
	if errors.As(err, &e) {
		if e.Detail != "" {
			p.Detail = e.Detail
		} else {
			p.Detail = e.Err.Error()
		}
		if e.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
		}
	} else if status != http.StatusInternalServerError {
		p.Detail = err.Error()
	}
	body, _ := json.Marshal(p)
	body = append(body, '\n') // as json.Encoder ends a document: a terminal shows the next prompt on its own line
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// GiveUpError is returned by the retrying Transport when every attempt of an
// operation failed without a response. It matches ErrGaveUp and unwraps to
// the last attempt's error.
type GiveUpError struct {
	Key      string // the Idempotency-Key every attempt carried ("" if none)
	Attempts int    // how many attempts were made
	Err      error  // the last attempt's error
}

// Error implements the error interface.
func (e *GiveUpError) Error() string {
	return fmt.Sprintf("httpidem: gave up after %d attempts (key %q): %v", e.Attempts, e.Key, e.Err)
}

// Unwrap returns ErrGaveUp and the last error.
func (e *GiveUpError) Unwrap() []error { return []error{ErrGaveUp, e.Err} }

// StatusError is returned by PostJSON for a final response outside 2xx.
type StatusError struct {
	Status   int
	Key      string // the Idempotency-Key of the operation
	Replayed bool   // the response was a replay of a stored one
	Body     []byte // the first bytes of the response body
}

// Error implements the error interface.
func (e *StatusError) Error() string {
	return fmt.Sprintf("httpidem: %d %s (key %q): %.200s", e.Status, http.StatusText(e.Status), e.Key, e.Body)
}
