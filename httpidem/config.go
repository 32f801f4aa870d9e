package httpidem

import (
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// Defaults of Config.
const (
	DefaultHeader           = "Idempotency-Key"
	DefaultTable            = "dedupe_http_keys"
	DefaultLease            = 90 * time.Second
	DefaultRetention        = 24 * time.Hour
	DefaultTenant           = "default"
	DefaultMaxRequestBytes  = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
	// DefaultLockTimeout is how long a request waits, in transactional mode,
	// for a concurrent request holding the same key before it answers 409.
	DefaultLockTimeout = 100 * time.Millisecond
	// MaxKeyLen is the longest Idempotency-Key accepted, in characters.
	MaxKeyLen = 255
	// ReplayedHeader is set to "true" on every replayed response.
	ReplayedHeader = "Idempotent-Replayed"
)

// DefaultMethods are the methods the middleware applies to by default.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// DefaultStoredHeaders are the response headers stored with a key and
// replayed by default.
var DefaultStoredHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language", "Location", "ETag", "Last-Modified", "Link"}

// Mode is how the middleware holds a key while its handler runs.
type Mode int

const (
	// Transactional claims the key inside the request's transaction, the one
	// Tx returns: the claim, the handler's writes and the stored response
	// commit together, in one transaction with one WAL flush, and BEGIN and
	// the claim cost one round trip (a replay after a run of new keys a
	// second, for the read of the key: Inbox.Claim). A
	// concurrent request with the same key waits for the holder at most
	// Config.LockTimeout and then answers 409; a process that dies
	// mid-request rolls its claim back with everything else. The default:
	// use it whenever the handler's effects are rows written through Tx.
	Transactional Mode = iota
	// Leased commits the claim on its own before the handler runs, as in
	// flight with a lease (Config.Inbox.Lease), and completes it afterwards
	// with the stored response (in the handler's transaction, if it opened
	// one with Tx): for handlers with effects outside the database (calls
	// to other APIs) or that run too long to hold a transaction open. A
	// concurrent duplicate answers 409 at once; a process that dies
	// mid-request blocks the key until its lease ends. It costs a second
	// commit (and WAL flush) per new key.
	Leased
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Transactional:
		return "transactional"
	case Leased:
		return "leased"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ServerErrorPolicy says what happens to the key when the handler answers
// 5xx or panics. Either way the handler's transaction is rolled back.
type ServerErrorPolicy int

const (
	// StoreServerErrors stores the error response with the key, so a retry
	// gets the same answer instead of a second execution (Stripe's
	// behaviour). The default.
	StoreServerErrors ServerErrorPolicy = iota
	// RetryServerErrors releases the key, so a retry with the same key
	// executes the handler again.
	RetryServerErrors
)

// OversizePolicy says what happens when a response is larger than
// Config.MaxResponseBytes.
type OversizePolicy int

const (
	// OversizeRefuse rolls back the handler's transaction, releases the key
	// and answers 500 (ErrResponseTooLarge): a response that cannot be
	// replayed faithfully is never committed. The default.
	OversizeRefuse OversizePolicy = iota
	// OversizeStoreHead commits the handler's work, sends the full response
	// to this client, and stores only its status and headers: replays carry
	// an empty body with "Idempotent-Body-Omitted: true", and the client
	// fetches the resource by reference (its Location header, for example).
	OversizeStoreHead
)

// BodyOmittedHeader is set to "true" on a replay whose body was not stored
// (OversizeStoreHead).
const BodyOmittedHeader = "Idempotent-Body-Omitted"

// Config configures the Middleware. The zero value is usable.
type Config struct {
	// Inbox configures the table that stores the keys. Its Table defaults
	// to "dedupe_http_keys", its Lease to 90s, its Retention (how long a
	// key is replayed) to 24h and its MaxAttempts to no limit; its other
	// fields default as in dedupe.
	//
	// The Lease bounds the handler in both modes: its context ends Lease
	// after the claim. A handler that returns after that (or after its
	// client went away) is not stored, whatever it answered: its work is
	// rolled back, the key released, and its client gets a retryable 503
	// (ErrRolledBack) rather than a success it wrote. In leased mode the
	// Lease is also how long a request whose process died blocks its key:
	// once the lease passed in the database, a retry takes the key over,
	// and the first request's completion is refused (its work rolled back,
	// ErrLeaseLost or ErrRolledBack answered). Size it above the handler's
	// slowest run, the commit included (its p99.9 with a margin of 2–3×),
	// and below how long a client may wait for a key held by a crashed
	// request; make the handler's steps honour its context, so that one cut
	// short stops at the lease instead of running on unseen.
	Inbox dedupe.Config
	// Mode is how the key is held while the handler runs. Defaults to
	// Transactional; override per route with Middleware.Leased and
	// Middleware.Transactional.
	Mode Mode
	// LockTimeout bounds, in transactional mode, how long a request waits
	// for a concurrent request that holds its key before answering 409. It
	// bounds the claim only: the handler's own statements wait for locks as
	// the connection's lock_timeout says. Defaults to 100ms.
	LockTimeout time.Duration
	// Methods are the request methods the middleware applies to; others
	// pass straight through. Defaults to POST and PATCH.
	Methods []string
	// Header is the request header holding the key. Defaults to
	// "Idempotency-Key".
	Header string
	// KeyRequired makes a request without a key fail with 400. Defaults to
	// false: such a request passes straight through. Override per route
	// with Middleware.Required and Middleware.Optional.
	KeyRequired bool
	// Tenant returns the tenant of the request, set by the authentication
	// middleware that runs before this one; keys are unique per (tenant,
	// key). An error or "" answers 401 (ErrNoTenant) and nothing is
	// recorded. Defaults to one tenant, "default", for all requests.
	Tenant func(r *http.Request) (string, error)
	// Fingerprint hashes the request; the same key with another fingerprint
	// answers 422. body is the whole request body. Defaults to
	// DefaultFingerprint (method, path, query and body); see
	// FingerprintWithHeaders.
	Fingerprint func(r *http.Request, body []byte) []byte
	// MaxRequestBytes bounds the request body read for fingerprinting;
	// larger bodies answer 413. Defaults to 1 MiB.
	MaxRequestBytes int64
	// MaxResponseBytes bounds the stored response body. Defaults to 1 MiB.
	MaxResponseBytes int
	// Oversize is the policy for responses over MaxResponseBytes. Defaults
	// to OversizeRefuse.
	Oversize OversizePolicy
	// ServerErrors is the policy for 5xx answers and panics. Defaults to
	// StoreServerErrors.
	ServerErrors ServerErrorPolicy
	// StoredHeaders are the response headers stored and replayed. Defaults
	// to DefaultStoredHeaders. Set-Cookie (a session handed to whoever
	// replays the key) and hop-by-hop headers (Connection, Keep-Alive,
	// Proxy-Authenticate, Proxy-Authorization, Proxy-Connection, TE, Trailer,
	// Transfer-Encoding, Upgrade: they describe one connection, not the
	// response) are refused.
	StoredHeaders []string
	// TxOptions are the options of the request transaction (isolation
	// level, read-only). In transactional mode the claim is written in it,
	// so read-only is refused, and its BEGIN is sent in a pipeline, so a
	// BeginQuery must be one statement. Defaults to the database's defaults
	// (read committed).
	TxOptions pgx.TxOptions
	// ErrorHandler writes the middleware's own refusals. Defaults to
	// WriteError (application/problem+json).
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
	// Logger receives the middleware's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// TrustCallers makes the middleware take a request's trace context
	// (traceparent) as the parent of its handling in the inbox's Observer
	// and adopt its baggage, which then reaches the handler's context and
	// the outbox messages it enqueues. Leave it false (the default) for an
	// API on the public internet: a caller would otherwise choose the trace
	// the handling joins, whether it is sampled, and the baggage your
	// services downstream read (a tenant, a user id). By default the
	// handling starts a trace of its own (or stays under your own server
	// span) that links the caller's, and the caller's baggage is dropped
	// (dedupe.MessageInfo.Untrusted). Set it only when every caller is a
	// service of yours.
	TrustCallers bool
}

// unstorableHeaders are the response headers StoredHeaders refuses, with
// the reason.
var unstorableHeaders = map[string]string{
	"Set-Cookie":          "a replay would hand the first client's cookies to whoever sends the key",
	"Set-Cookie2":         "a replay would hand the first client's cookies to whoever sends the key",
	"Connection":          "hop-by-hop header",
	"Keep-Alive":          "hop-by-hop header",
	"Proxy-Authenticate":  "hop-by-hop header",
	"Proxy-Authorization": "hop-by-hop header",
	"Proxy-Connection":    "hop-by-hop header",
	"Te":                  "hop-by-hop header",
	"Trailer":             "hop-by-hop header",
	"Transfer-Encoding":   "hop-by-hop header",
	"Upgrade":             "hop-by-hop header",
}

func (c Config) withDefaults() (Config, error) {
	out := c
	if out.Inbox.Table == "" {
		out.Inbox.Table = DefaultTable
	}
	if out.Inbox.Lease == 0 {
		out.Inbox.Lease = DefaultLease
	}
	if out.Inbox.Retention == 0 {
		out.Inbox.Retention = DefaultRetention
	}
	if out.Inbox.MaxAttempts == 0 {
		out.Inbox.MaxAttempts = -1
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Inbox.Logger == nil {
		out.Inbox.Logger = out.Logger
	}
	if len(out.Methods) == 0 {
		out.Methods = DefaultMethods
	}
	out.Methods = slices.Clone(out.Methods)
	for i, m := range out.Methods {
		out.Methods[i] = strings.ToUpper(m)
	}
	if out.Header == "" {
		out.Header = DefaultHeader
	}
	out.Header = http.CanonicalHeaderKey(out.Header)
	if out.Tenant == nil {
		out.Tenant = func(*http.Request) (string, error) { return DefaultTenant, nil }
	}
	if out.Fingerprint == nil {
		out.Fingerprint = DefaultFingerprint
	}
	if out.MaxRequestBytes == 0 {
		out.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if out.MaxResponseBytes == 0 {
		out.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if out.StoredHeaders == nil {
		out.StoredHeaders = DefaultStoredHeaders
	}
	stored := make([]string, len(out.StoredHeaders))
	for i, h := range out.StoredHeaders {
		stored[i] = http.CanonicalHeaderKey(strings.TrimSpace(h))
		if reason, bad := unstorableHeaders[stored[i]]; bad {
			return out, &dedupe.ConfigError{Field: "StoredHeaders", Reason: stored[i] + " must not be stored: " + reason}
		}
		if stored[i] == "" {
			return out, &dedupe.ConfigError{Field: "StoredHeaders", Reason: "holds an empty name"}
		}
	}
	out.StoredHeaders = stored
	if out.LockTimeout == 0 {
		out.LockTimeout = DefaultLockTimeout
	}
	if out.ErrorHandler == nil {
		out.ErrorHandler = WriteError
	}
	switch {
	case out.MaxRequestBytes < 0:
		return out, &dedupe.ConfigError{Field: "MaxRequestBytes", Reason: "must be positive"}
	case out.MaxResponseBytes < 0:
		return out, &dedupe.ConfigError{Field: "MaxResponseBytes", Reason: "must be positive"}
	case out.Oversize != OversizeRefuse && out.Oversize != OversizeStoreHead:
		return out, &dedupe.ConfigError{Field: "Oversize", Reason: "unknown policy"}
	case out.ServerErrors != StoreServerErrors && out.ServerErrors != RetryServerErrors:
		return out, &dedupe.ConfigError{Field: "ServerErrors", Reason: "unknown policy"}
	case out.Mode != Transactional && out.Mode != Leased:
		return out, &dedupe.ConfigError{Field: "Mode", Reason: "unknown mode"}
	case out.LockTimeout < 0:
		return out, &dedupe.ConfigError{Field: "LockTimeout", Reason: "must be positive"}
	case out.Mode == Transactional && out.TxOptions.AccessMode == pgx.ReadOnly:
		return out, &dedupe.ConfigError{Field: "TxOptions", Reason: "read-only in transactional mode, where the claim is written in the request transaction"}
	}
	return out, nil
}
