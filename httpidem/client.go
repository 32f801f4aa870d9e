package httpidem

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe"
)

// Defaults of TransportConfig.
const (
	DefaultMaxAttempts     = 5
	DefaultInitialBackoff  = 100 * time.Millisecond
	DefaultMaxBackoff      = 10 * time.Second
	DefaultMaxRetryAfter   = time.Minute
	DefaultAttemptTimeout  = 30 * time.Second
	DefaultRequestIDHeader = "X-Request-Id"
)

// idempotentMethods may be retried without a key (RFC 9110 §9.2.2).
var idempotentMethods = []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete}

// TransportConfig configures the retrying Transport. The zero value is
// usable.
type TransportConfig struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// MaxAttempts is how many times one operation is tried before giving up
	// (the first try included). Defaults to 5.
	MaxAttempts int
	// InitialBackoff is the wait before the second attempt; it doubles with
	// each further attempt up to MaxBackoff (dedupe.Backoff), and each wait
	// is jittered to between half and all of it. Defaults to 100ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the backoff. Defaults to 10s.
	MaxBackoff time.Duration
	// MaxRetryAfter is the longest Retry-After the transport waits for; a
	// response asking for longer is returned to the caller. Defaults to 1m.
	MaxRetryAfter time.Duration
	// AttemptTimeout bounds each attempt up to the response headers and the
	// reading of its body; an attempt that times out is retried. Defaults to
	// 30s; negative means no per-attempt timeout.
	AttemptTimeout time.Duration
	// Methods are the methods that get an Idempotency-Key (one per
	// RoundTrip call, kept for all its attempts) and are therefore safe to
	// retry. A request that already carries the header keeps its key.
	// Idempotent methods (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) are
	// retried without a key; any other method without a key is sent once.
	// Defaults to POST and PATCH.
	Methods []string
	// Header is the key's header. Defaults to "Idempotency-Key".
	Header string
	// RequestIDHeader carries a new id on every attempt, for tracing; it is
	// never the idempotency key. Defaults to "X-Request-Id".
	RequestIDHeader string
	// Logger receives a debug line per retry. Defaults to slog.Default().
	Logger *slog.Logger
}

// Transport is an http.RoundTripper that retries an operation with one
// Idempotency-Key across all its attempts. It retries connection errors,
// timeouts, 409, 429 and 5xx with exponential backoff and jitter, honours
// Retry-After, never retries other statuses, never retries a response marked
// "Idempotent-Replayed: true" (the server's final, stored answer), and after
// MaxAttempts returns the last response, or a *GiveUpError holding the last
// error when no attempt got a response. It is safe for concurrent use.
type Transport struct {
	cfg TransportConfig
}

// NewTransport returns a Transport; the zero TransportConfig is the
// defaults.
func NewTransport(cfg TransportConfig) (*Transport, error) {
	c := cfg
	if c.Base == nil {
		c.Base = http.DefaultTransport
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.InitialBackoff == 0 {
		c.InitialBackoff = DefaultInitialBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = DefaultAttemptTimeout
	}
	if len(c.Methods) == 0 {
		c.Methods = DefaultMethods
	}
	c.Methods = slices.Clone(c.Methods)
	for i, m := range c.Methods {
		c.Methods[i] = strings.ToUpper(m)
	}
	if c.Header == "" {
		c.Header = DefaultHeader
	}
	if c.RequestIDHeader == "" {
		c.RequestIDHeader = DefaultRequestIDHeader
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.MaxAttempts < 1:
		return nil, &dedupe.ConfigError{Field: "MaxAttempts", Reason: "must be at least 1"}
	case c.InitialBackoff < 0 || c.MaxBackoff < 0 || c.MaxRetryAfter < 0:
		return nil, &dedupe.ConfigError{Field: "InitialBackoff/MaxBackoff/MaxRetryAfter", Reason: "must not be negative"}
	case c.MaxBackoff < c.InitialBackoff:
		return nil, &dedupe.ConfigError{Field: "MaxBackoff", Reason: "must be at least InitialBackoff"}
	case strings.EqualFold(c.Header, c.RequestIDHeader):
		return nil, &dedupe.ConfigError{Field: "RequestIDHeader", Reason: "must differ from Header: a per-attempt id is not an idempotency key"}
	}
	return &Transport{cfg: c}, nil
}

// NewClient returns an *http.Client using a Transport built from cfg.
func NewClient(cfg TransportConfig) (*http.Client, error) {
	t, err := NewTransport(cfg)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// RoundTrip sends req, retrying as the Transport's doc says. One RoundTrip
// call is one logical operation: its key is generated here (unless req
// carries one) and sent with every attempt.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	key := req.Header.Get(t.cfg.Header)
	retryable := true
	switch {
	case slices.Contains(t.cfg.Methods, req.Method):
		if key == "" {
			key = NewKey()
		}
	case key != "", slices.Contains(idempotentMethods, req.Method):
	default:
		retryable = false
	}
	body, err := replayableBody(req)
	if err != nil {
		return nil, err
	}
	attempts := t.cfg.MaxAttempts
	if !retryable {
		attempts = 1
	}
	var lastErr error
	for attempt := 1; ; attempt++ {
		resp, err := t.attempt(ctx, req, key, body)
		last := attempt >= attempts
		var wait time.Duration
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return nil, err // the caller gave up
			}
			lastErr = err
			if last {
				if attempts == 1 {
					return nil, err
				}
				return nil, &GiveUpError{Key: key, Attempts: attempt, Err: lastErr}
			}
			wait = t.backoff(attempt)
		default:
			if last || !retryStatus(resp) {
				return resp, nil
			}
			wait = t.backoff(attempt)
			if ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
				if ra > t.cfg.MaxRetryAfter {
					return resp, nil
				}
				wait = max(wait, ra)
			}
			drain(resp.Body)
			lastErr = fmt.Errorf("httpidem: %s", resp.Status)
		}
		t.cfg.Logger.DebugContext(ctx, "httpidem: retrying", "method", req.Method, "url", req.URL.Redacted(),
			"key", key, "attempt", attempt, "wait", wait, "err", lastErr)
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// CloseIdleConnections closes the idle connections of the base transport,
// so that http.Client.CloseIdleConnections reaches it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.cfg.Base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// attempt sends one attempt with the operation's key and a fresh request id.
func (t *Transport) attempt(ctx context.Context, req *http.Request, key string, body func() (io.ReadCloser, error)) (*http.Response, error) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if t.cfg.AttemptTimeout > 0 {
		actx, cancel = context.WithTimeout(ctx, t.cfg.AttemptTimeout)
	}
	r := req.Clone(actx)
	if key != "" {
		r.Header.Set(t.cfg.Header, key)
	}
	r.Header.Set(t.cfg.RequestIDHeader, NewKey())
	if body != nil {
		b, err := body()
		if err != nil {
			cancel()
			return nil, fmt.Errorf("httpidem: replay request body: %w", err)
		}
		r.Body = b
	}
	resp, err := t.cfg.Base.RoundTrip(r)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// replayableBody returns a function giving a fresh copy of the body for each
// attempt (nil for no body), reading and closing req.Body when the request
// has no GetBody.
func replayableBody(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		_ = req.Body.Close()
		return req.GetBody, nil
	}
	b, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("httpidem: read request body: %w", err)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, nil
}

// retryStatus reports whether a response is worth another attempt.
func retryStatus(resp *http.Response) bool {
	if resp.Header.Get(ReplayedHeader) == "true" {
		return false // the server's stored, final answer
	}
	s := resp.StatusCode
	return s == http.StatusConflict || s == http.StatusTooManyRequests || s >= 500 && s <= 599
}

// backoff is the jittered exponential wait after attempt (1-based).
func (t *Transport) backoff(attempt int) time.Duration {
	return dedupe.Backoff{Min: t.cfg.InitialBackoff, Max: t.cfg.MaxBackoff, Jitter: 0.5}.Delay(attempt)
}

// parseRetryAfter reads a Retry-After of delay-seconds or an HTTP-date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// drain reads a little of a discarded body so the connection can be reused.
func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	_ = body.Close()
}

// cancelOnClose ends an attempt's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

// Close closes the body and ends the attempt's context.
func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// RequestOption adjusts a request built by PostJSON.
type RequestOption func(r *http.Request, keyHeader string)

// WithHeader sets a request header (authentication, tenant, tracing).
func WithHeader(name, value string) RequestOption {
	return func(r *http.Request, _ string) { r.Header.Set(name, value) }
}

// WithKey sends key as the Idempotency-Key instead of a new one: for an
// operation whose key the caller persisted, so that a retry after a restart
// of the client is still the same operation.
func WithKey(key string) RequestOption {
	return func(r *http.Request, keyHeader string) { r.Header.Set(keyHeader, key) }
}

// Reply describes the final response of PostJSON.
type Reply struct {
	Status   int
	Header   http.Header
	Key      string // the operation's Idempotency-Key
	Replayed bool   // the server replayed a stored response
}

// maxReplyBytes bounds the response body PostJSON reads.
const maxReplyBytes = 16 << 20

// PostJSON runs one logical operation: it POSTs in as JSON to url with a new
// Idempotency-Key (see NewKey) and decodes a 2xx JSON answer into out (when
// out is not nil). Use a client from NewClient so that every retry carries
// the same key. A final answer outside 2xx returns the Reply with a
// *StatusError; a transport failure returns the client's error (a
// *GiveUpError inside a *url.Error when retries ran out).
//
// opts adjust the request (WithHeader, WithKey) before it is sent.
func PostJSON(ctx context.Context, c *http.Client, url string, in, out any, opts ...RequestOption) (*Reply, error) {
	payload, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("httpidem: encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	header := DefaultHeader
	if t, ok := c.Transport.(*Transport); ok {
		header = t.cfg.Header
	}
	req.Header.Set(header, NewKey())
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	for _, o := range opts {
		o(req, header)
	}
	key := req.Header.Get(header)
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return nil, fmt.Errorf("httpidem: read response (key %q): %w", key, err)
	}
	reply := &Reply{Status: resp.StatusCode, Header: resp.Header, Key: key, Replayed: resp.Header.Get(ReplayedHeader) == "true"}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return reply, &StatusError{Status: resp.StatusCode, Key: key, Replayed: reply.Replayed, Body: body[:min(len(body), 4096)]}
	}
	if out != nil && len(body) > 0 {
		if err := json.Unmarshal(body, out); err != nil {
			return reply, fmt.Errorf("httpidem: decode response (key %q): %w", key, err)
		}
	}
	return reply, nil
}
