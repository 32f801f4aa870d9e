package webhook

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/exactlyonce/dedupe"
)

// Defaults of Config.
const (
	DefaultEndpoint     = "default"
	DefaultMaxBodyBytes = 1 << 20
	DefaultLockTimeout  = 5 * time.Second
	DefaultRetryAfter   = 5 * time.Second
)

// Config configures a Handler. The zero value is usable.
type Config struct {
	// Endpoint names this receiver among those of its provider. The dedup
	// scope is Scope(provider, Endpoint), so two endpoints never share keys.
	// Defaults to "default".
	Endpoint string
	// MaxBodyBytes is the largest body accepted; a larger one gets 413
	// without being read in full. Defaults to 1 MiB.
	MaxBodyBytes int64
	// LockTimeout bounds how long a delivery waits for a concurrent delivery
	// of the same event that is still in its transaction; after it the
	// delivery gets 503 with Retry-After. It applies to every lock the
	// handler's transaction waits for, and should stay well below the
	// provider's response timeout (about 10 s for Stripe and GitHub, 15 s for
	// Svix). Defaults to 5s.
	LockTimeout time.Duration
	// RetryAfter is the Retry-After of a 503. Defaults to 5s.
	RetryAfter time.Duration
	// MaxAttempts is how many failed attempts an event gets before its key
	// is marked failed and the handler no longer runs for it. Defaults to
	// the inbox's Config.MaxAttempts; negative means no limit.
	MaxAttempts int
	// Clock returns the current time for the timestamp tolerance. Defaults
	// to time.Now.
	Clock func() time.Time
	// Logger receives the handler's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// TrustCallers makes the receiver take a delivery's trace context
	// (traceparent) as the parent of its handling and adopt its baggage,
	// which then reaches the handler's context and the outbox messages it
	// enqueues. Leave it false (the default) for a provider on the public
	// internet: the signature covers none of these headers, so any sender,
	// or anyone replaying a signed delivery within the tolerance, would
	// choose the trace the handling joins, whether it is sampled, and the
	// baggage your services downstream read (a tenant, a user id). By
	// default the handling starts a trace of its own that links the
	// sender's, and the sender's baggage is dropped
	// (dedupe.MessageInfo.Untrusted). Set it only when every caller is a
	// service of yours.
	TrustCallers bool
	// OnError is called for every delivery that did not get a 2xx, with the
	// status about to be written and the typed error (see error.go).
	// Defaults to logging it through Logger: refusals at Warn, failures at
	// Error.
	OnError func(r *http.Request, status int, err error)
}

func (c Config) withDefaults() (Config, error) {
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.MaxBodyBytes < 0:
		return c, &dedupe.ConfigError{Field: "MaxBodyBytes", Reason: "must be positive"}
	case c.LockTimeout < 0:
		return c, &dedupe.ConfigError{Field: "LockTimeout", Reason: "must be positive"}
	case c.RetryAfter < 0:
		return c, &dedupe.ConfigError{Field: "RetryAfter", Reason: "must be positive"}
	}
	if c.OnError == nil {
		logger := c.Logger
		c.OnError = func(r *http.Request, status int, err error) {
			level := slog.LevelWarn
			if status >= 500 {
				level = slog.LevelError
			}
			logger.Log(r.Context(), level, "webhook: delivery not accepted",
				"path", r.URL.Path, "status", status, "err", err)
		}
	}
	return c, nil
}

// Handler is an http.Handler receiving one provider's webhooks at one
// endpoint. It is safe for concurrent use.
type Handler struct {
	verifier Verifier
	consumer *dedupe.Consumer[Event]
	cfg      Config
	provider string
	obs      dedupe.Observer // the inbox's, told of refused deliveries
}

// validator is implemented by the built-in verifiers.
type validator interface{ validate() error }

// New returns a Handler that authenticates deliveries with v and runs h once
// per dedup key (Event.Key, or Event.ID when v leaves Key empty), in the
// transaction that claims the key in inbox. Use NewStripe, NewGitHub,
// NewStandard or NewHMAC for the built-in providers.
//
// Responses:
//
//   - 200 "processed": the handler ran and its transaction committed.
//   - 200 "duplicate": the event was processed before; nothing ran. A 2xx,
//     so that the provider stops re-sending.
//   - 500 "handler failed": the handler returned an error or panicked; the
//     claim rolled back with its effects, and the provider's retry runs it
//     again. Also for an event whose attempts are used up ("event marked
//     failed"): the failure stays visible in the provider's dashboard, and
//     its retries succeed once an operator has released the key.
//   - 503 "in flight" with Retry-After: a concurrent delivery of the same
//     event holds the claim and did not finish within LockTimeout. Not 409:
//     nothing conflicts, the delivery is merely early, and 503 with
//     Retry-After is the status that says "try the same request again
//     later" to every sender, including those that give up on a 4xx. Also
//     503 when the database fails.
//   - 400 with a short reason: missing, malformed or wrong signature, a
//     stale timestamp, no event id. No database work is done.
//   - 413: the body exceeds MaxBodyBytes. 405: not a POST.
//
// The inbox's Observer is told of every handled event (with the provider,
// endpoint, event id and headers) and of every refusal before a claim
// (400, 405, 413) as a dedupe.EventRefused with the typed error.
//
// No payload fingerprint is stored with the key: providers may rebuild the
// payload of a re-send (Stripe's pending_webhooks counter, for one), so the
// same event id with another body is the same event, not a client bug.
// (GitHub's key is the body's hash, so there the question does not arise.)
//
// h receives the transaction of the inbox's driver: a pgx.Tx for an inbox
// over a pgx pool, a *sql.Tx for an inbox over dedupe.SQL. A handler of the
// other type is refused with a *dedupe.ConfigError.
func New[TTx any](inbox *dedupe.Inbox, v Verifier, cfg Config, h dedupe.TxHandlerFunc[TTx, Event]) (*Handler, error) {
	if v == nil {
		return nil, &dedupe.ConfigError{Field: "verifier", Reason: "must not be nil"}
	}
	if val, ok := v.(validator); ok {
		if err := val.validate(); err != nil {
			return nil, err
		}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	provider := v.Provider()
	consumer, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[Event]{
		Scope:       Scope(provider, c.Endpoint),
		Key:         func(e Event) (string, error) { return e.key(), nil },
		LockTimeout: c.LockTimeout,
		MaxAttempts: c.MaxAttempts,
		Describe: func(e Event) dedupe.MessageInfo {
			m := describe(e)
			m.Untrusted = !c.TrustCallers
			return m
		},
	}, h)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	return &Handler{verifier: v, consumer: consumer, cfg: c, provider: provider, obs: inbox.Config().Observer}, nil
}

// Scope returns the dedup scope of the handler's keys.
func (h *Handler) Scope() string { return h.consumer.Scope() }

// ServeHTTP receives one delivery; see New for the responses.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.refuse(w, r, ErrMethodNotAllowed)
		return
	}
	body, err := h.readBody(w, r)
	if err != nil {
		h.refuse(w, r, err)
		return
	}
	ev, err := h.verifier.Verify(r.Header, body, h.cfg.Clock())
	if err != nil {
		h.refuse(w, r, err)
		return
	}
	ev.Provider, ev.Endpoint, ev.Header, ev.Body = h.provider, h.cfg.Endpoint, r.Header, body
	key, err := h.consumer.KeyOf(ev)
	if err != nil {
		h.refuse(w, r, &EventError{Provider: h.provider, Field: "id", Reason: err.Error()})
		return
	}

	outcome, err := h.consumer.HandleKey(r.Context(), key, ev)
	switch {
	case err == nil && outcome == dedupe.OutcomeDuplicate:
		reply(w, http.StatusOK, "duplicate")
	case err == nil:
		reply(w, http.StatusOK, "processed")
	case outcome == dedupe.OutcomeRetry:
		h.fail(w, r, http.StatusInternalServerError, "handler failed", err)
	case outcome == dedupe.OutcomePoisoned:
		h.fail(w, r, http.StatusInternalServerError, "event marked failed", err)
	case outcome == dedupe.OutcomeConflict:
		h.fail(w, r, http.StatusUnprocessableEntity, "event id reused with another payload", err)
	case outcome == dedupe.OutcomeInFlight:
		h.retryLater(w)
		h.fail(w, r, http.StatusServiceUnavailable, "in flight", err)
	default: // the database failed, or the sender went away
		h.retryLater(w)
		h.fail(w, r, http.StatusServiceUnavailable, "unavailable", err)
	}
}

// retryLater sets Retry-After to RetryAfter in whole seconds, at least 1.
func (h *Handler) retryLater(w http.ResponseWriter) {
	secs := max(h.cfg.RetryAfter.Round(time.Second), time.Second) / time.Second
	w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
}

// readBody reads at most MaxBodyBytes, refusing a larger declared body
// without reading any of it.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	limit := h.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, &BodyTooLargeError{Limit: limit, Declared: r.ContentLength}
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, &BodyTooLargeError{Limit: limit, Declared: -1}
	case err != nil && !errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: %w", ErrBodyRead, err)
	}
	return buf.Bytes(), nil
}

// refuse answers a delivery refused before any claim, and tells the
// inbox's Observer (dedupe.EventRefused).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, err error) {
	status, reason := refusal(err)
	if h.obs != nil {
		h.obs.TransportEvent(r.Context(), dedupe.TransportEvent{Name: dedupe.EventRefused, Err: err, Count: 1,
			Message: describe(Event{Provider: h.provider, Endpoint: h.cfg.Endpoint, Header: r.Header})})
	}
	h.fail(w, r, status, reason, err)
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, reason string, err error) {
	h.cfg.OnError(r, status, err)
	reply(w, status, reason)
}

func reply(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, text+"\n")
}
