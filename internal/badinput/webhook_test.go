package badinput_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
)

const (
	stripeSecret = "whsec_badinput"
	githubSecret = "gh-badinput"
	hmacSecret   = "hmac-badinput"
)

// standardSecret is a Standard Webhooks secret and its key.
var (
	standardKey    = []byte("standard-webhooks-badinput-key!!")
	standardSecret = "whsec_" + base64.StdEncoding.EncodeToString(standardKey)
)

func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

func stripeSig(ts time.Time, body, secret string) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	return "t=" + t + ",v1=" + hex.EncodeToString(mac([]byte(secret), t, ".", body))
}

func githubSig(body, secret string) string {
	return "sha256=" + hex.EncodeToString(mac([]byte(secret), body))
}

func standardHeaders(id string, ts time.Time, body string, key []byte) http.Header {
	t := strconv.FormatInt(ts.Unix(), 10)
	return http.Header{
		webhook.StandardIDHeader:        {id},
		webhook.StandardTimestampHeader: {t},
		webhook.StandardSignatureHeader: {"v1," + base64.StdEncoding.EncodeToString(mac(key, id, ".", t, ".", body))},
	}
}

// refusalRecorder captures what Config.OnError is told.
type refusalRecorder struct {
	mu     sync.Mutex
	status int
	err    error
	calls  int
}

func (r *refusalRecorder) onError(_ *http.Request, status int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status, r.err = status, err
	r.calls++
}

// request is one delivery of the table.
type request struct {
	method string
	header http.Header
	body   string
	// streamed sends the body without a Content-Length.
	streamed bool
}

// webhookCase is one refused delivery.
type webhookCase struct {
	name     string
	provider string // stripe, github, standard, hmac
	req      request
	status   int
	is       []error
	as       func(err error) bool
}

func TestWebhookRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	now := time.Now()
	const maxBody = 1024
	ran := 0
	var ranMu sync.Mutex
	h := func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
		ranMu.Lock()
		ran++
		ranMu.Unlock()
		return effect(ctx, tx, ev.ID)
	}
	rec := &refusalRecorder{}
	cfg := webhook.Config{MaxBodyBytes: maxBody, OnError: rec.onError, Clock: func() time.Time { return now }}
	stripe, err := webhook.NewStripe(e.inbox, webhook.StripeConfig{Secrets: []string{stripeSecret}, Config: cfg}, h)
	if err != nil {
		t.Fatal(err)
	}
	github, err := webhook.NewGitHub(e.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}, Config: cfg}, h)
	if err != nil {
		t.Fatal(err)
	}
	standard, err := webhook.NewStandard(e.inbox, webhook.StandardConfig{Secrets: []string{standardSecret}, Config: cfg}, h)
	if err != nil {
		t.Fatal(err)
	}
	generic, err := webhook.NewHMAC(e.inbox, webhook.HMACConfig{HMACVerifier: webhook.HMACVerifier{
		Secrets: []string{hmacSecret}, SignatureHeader: "X-Signature", SignedContent: "{id}.{timestamp}.{body}",
		TimestampHeader: "X-Timestamp", IDHeader: "X-Event-Id",
	}, Config: cfg}, h)
	if err != nil {
		t.Fatal(err)
	}
	handlers := map[string]http.Handler{"stripe": stripe, "github": github, "standard": standard, "hmac": generic}

	stripeOK := `{"id":"evt_1","type":"invoice.paid"}`
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	stripeReq := func(body string, sig string) request {
		return request{method: http.MethodPost, header: hdr(webhook.StripeSignatureHeader, sig), body: body}
	}
	githubReq := func(id, body, sig string) request {
		h := hdr(webhook.GitHubEventHeader, "push")
		if id != "" {
			h.Set(webhook.GitHubDeliveryHeader, id)
		}
		if sig != "" {
			h.Set(webhook.GitHubSignatureHeader, sig)
		}
		return request{method: http.MethodPost, header: h, body: body}
	}
	hmacReq := func(id string, ts time.Time, body, secret string) request {
		t := strconv.FormatInt(ts.Unix(), 10)
		return request{method: http.MethodPost, body: body, header: hdr("X-Event-Id", id, "X-Timestamp", t,
			"X-Signature", hex.EncodeToString(mac([]byte(secret), id, ".", t, ".", body)))}
	}
	big := `{"id":"evt_big","pad":"` + strings.Repeat("x", maxBody) + `"}`
	sigErr := func(err error) bool { var se *webhook.SignatureError; return errors.As(err, &se) }
	tsErr := func(err error) bool { var te *webhook.TimestampError; return errors.As(err, &te) && sigErr(err) }
	evErr := func(err error) bool { var ee *webhook.EventError; return errors.As(err, &ee) }
	sizeErr := func(declared int64) func(error) bool {
		return func(err error) bool {
			var be *webhook.BodyTooLargeError
			return errors.As(err, &be) && be.Limit == maxBody && be.Declared == declared
		}
	}

	cases := []webhookCase{
		// Methods and sizes, the same for every provider.
		{"GET", "stripe", request{method: http.MethodGet}, 405, []error{webhook.ErrMethodNotAllowed}, nil},
		{"PUT", "github", request{method: http.MethodPut, body: "{}"}, 405, []error{webhook.ErrMethodNotAllowed}, nil},
		{"body over the limit, declared", "stripe", stripeReq(big, stripeSig(now, big, stripeSecret)), 413,
			[]error{webhook.ErrBodyTooLarge}, sizeErr(int64(len(big)))},
		{"body over the limit, streamed", "standard", request{method: http.MethodPost, body: big, streamed: true,
			header: standardHeaders("msg_big", now, big, standardKey)}, 413, []error{webhook.ErrBodyTooLarge}, sizeErr(-1)},

		// Stripe signatures and timestamps.
		{"stripe: no signature header", "stripe", request{method: http.MethodPost, body: stripeOK}, 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrMissingSignature}, sigErr},
		{"stripe: malformed signature header", "stripe", stripeReq(stripeOK, "garbage"), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrMalformedSignature}, sigErr},
		{"stripe: signature without v1", "stripe", stripeReq(stripeOK, "t="+strconv.FormatInt(now.Unix(), 10)), 400,
			[]error{webhook.ErrInvalidSignature}, sigErr},
		{"stripe: wrong secret", "stripe", stripeReq(stripeOK, stripeSig(now, stripeOK, "whsec_other")), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrSignatureMismatch}, sigErr},
		{"stripe: body changed after signing", "stripe", stripeReq(strings.Replace(stripeOK, "paid", "void", 1), stripeSig(now, stripeOK, stripeSecret)), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrSignatureMismatch}, sigErr},
		{"stripe: stale timestamp (replay)", "stripe", stripeReq(stripeOK, stripeSig(now.Add(-10*time.Minute), stripeOK, stripeSecret)), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrStaleTimestamp}, tsErr},
		{"stripe: timestamp in the future", "stripe", stripeReq(stripeOK, stripeSig(now.Add(10*time.Minute), stripeOK, stripeSecret)), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrStaleTimestamp}, tsErr},
		{"stripe: signed body without id", "stripe", stripeReq(`{"type":"x"}`, stripeSig(now, `{"type":"x"}`, stripeSecret)), 400,
			[]error{webhook.ErrMalformedEvent}, evErr},
		{"stripe: signed body not JSON", "stripe", stripeReq(`not json`, stripeSig(now, `not json`, stripeSecret)), 400,
			[]error{webhook.ErrMalformedEvent}, evErr},
		{"stripe: id of 256 bytes", "stripe", func() request {
			b := `{"id":"` + strings.Repeat("e", 256) + `"}`
			return stripeReq(b, stripeSig(now, b, stripeSecret))
		}(), 400, []error{webhook.ErrMalformedEvent}, evErr},
		{"stripe: id with a NUL", "stripe", func() request {
			b := `{"id":"evt_\u0000"}`
			return stripeReq(b, stripeSig(now, b, stripeSecret))
		}(), 400, []error{webhook.ErrMalformedEvent}, evErr},
		{"stripe: empty id", "stripe", func() request {
			b := `{"id":""}`
			return stripeReq(b, stripeSig(now, b, stripeSecret))
		}(), 400, []error{webhook.ErrMalformedEvent}, evErr},

		// GitHub.
		{"github: no signature", "github", githubReq("d-1", "{}", ""), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrMissingSignature}, sigErr},
		{"github: sha1 signature", "github", githubReq("d-1", "{}", "sha1=0123456789abcdef0123456789abcdef01234567"), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrMalformedSignature}, sigErr},
		{"github: wrong secret", "github", githubReq("d-1", "{}", githubSig("{}", "other")), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrSignatureMismatch}, sigErr},
		{"github: no delivery id", "github", githubReq("", "{}", githubSig("{}", githubSecret)), 400,
			[]error{webhook.ErrMalformedEvent}, evErr},
		{"github: delivery id with a control char", "github", githubReq("d-\x01", "{}", githubSig("{}", githubSecret)), 400,
			[]error{webhook.ErrMalformedEvent}, evErr},

		// Standard Webhooks.
		{"standard: no signature", "standard", func() request {
			h := standardHeaders("msg_1", now, "{}", standardKey)
			h.Del(webhook.StandardSignatureHeader)
			return request{method: http.MethodPost, header: h, body: "{}"}
		}(), 400, []error{webhook.ErrInvalidSignature, webhook.ErrMissingSignature}, sigErr},
		{"standard: no webhook-id", "standard", func() request {
			h := standardHeaders("msg_1", now, "{}", standardKey)
			h.Del(webhook.StandardIDHeader)
			return request{method: http.MethodPost, header: h, body: "{}"}
		}(), 400, []error{webhook.ErrInvalidSignature, webhook.ErrMissingSignature}, sigErr},
		{"standard: timestamp not a number", "standard", func() request {
			h := standardHeaders("msg_1", now, "{}", standardKey)
			h.Set(webhook.StandardTimestampHeader, "yesterday")
			return request{method: http.MethodPost, header: h, body: "{}"}
		}(), 400, []error{webhook.ErrInvalidSignature, webhook.ErrMalformedSignature}, sigErr},
		{"standard: stale timestamp", "standard", request{method: http.MethodPost, body: "{}",
			header: standardHeaders("msg_1", now.Add(-time.Hour), "{}", standardKey)}, 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrStaleTimestamp}, tsErr},
		{"standard: wrong key", "standard", request{method: http.MethodPost, body: "{}",
			header: standardHeaders("msg_1", now, "{}", []byte("another key"))}, 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrSignatureMismatch}, sigErr},
		{"standard: id changed after signing", "standard", func() request {
			h := standardHeaders("msg_1", now, "{}", standardKey)
			h.Set(webhook.StandardIDHeader, "msg_2")
			return request{method: http.MethodPost, header: h, body: "{}"}
		}(), 400, []error{webhook.ErrInvalidSignature, webhook.ErrSignatureMismatch}, sigErr},
		{"standard: id of 256 bytes", "standard", request{method: http.MethodPost, body: "{}",
			header: standardHeaders(strings.Repeat("m", 256), now, "{}", standardKey)}, 400,
			[]error{webhook.ErrMalformedEvent}, evErr},

		// Generic HMAC.
		{"hmac: wrong secret", "hmac", hmacReq("ev-1", now, "{}", "other"), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrSignatureMismatch}, sigErr},
		{"hmac: stale timestamp", "hmac", hmacReq("ev-1", now.Add(-time.Hour), "{}", hmacSecret), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrStaleTimestamp}, tsErr},
		{"hmac: no event id", "hmac", hmacReq("", now, "{}", hmacSecret), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrMissingSignature}, sigErr},
		{"hmac: id changed after signing (a pre-claim)", "hmac", func() request {
			r := hmacReq("ev-1", now, "{}", hmacSecret)
			r.header.Set("X-Event-Id", "ev-2")
			return r
		}(), 400, []error{webhook.ErrInvalidSignature, webhook.ErrSignatureMismatch}, sigErr},
		{"hmac: id holding the separator", "hmac", hmacReq("ev.1", now, "{}", hmacSecret), 400,
			[]error{webhook.ErrInvalidSignature, webhook.ErrMalformedSignature}, sigErr},
		{"hmac: id of 256 bytes", "hmac", hmacReq(strings.Repeat("e", 256), now, "{}", hmacSecret), 400,
			[]error{webhook.ErrMalformedEvent}, evErr},
	}
	for _, c := range cases {
		rec.mu.Lock()
		rec.calls, rec.err, rec.status = 0, nil, 0
		rec.mu.Unlock()
		var body io.Reader = strings.NewReader(c.req.body)
		if c.req.streamed {
			body = io.MultiReader(strings.NewReader(c.req.body)) // hides the length
		}
		r := httptest.NewRequest(c.req.method, "/hooks/"+c.provider, body)
		if c.req.streamed {
			r.ContentLength = -1
		}
		for k, v := range c.req.header {
			r.Header[k] = v
		}
		w := httptest.NewRecorder()
		handlers[c.provider].ServeHTTP(w, r)
		rec.mu.Lock()
		status, err, calls := rec.status, rec.err, rec.calls
		rec.mu.Unlock()
		if w.Code != c.status || status != c.status || calls != 1 {
			t.Errorf("%s: status %d (OnError saw %d, %d calls), want %d; body %q", c.name, w.Code, status, calls, c.status, w.Body.String())
			continue
		}
		for _, want := range c.is {
			if !errors.Is(err, want) {
				t.Errorf("%s: err = %v, want it to match %v", c.name, err, want)
			}
		}
		if c.as != nil && !c.as(err) {
			t.Errorf("%s: err = %#v is not the expected typed error", c.name, err)
		}
	}
	if ran != 0 {
		t.Errorf("handler ran %d times for refused deliveries", ran)
	}
	e.assertNothingWritten(t)

	// The control: a good delivery of each provider is processed, so the
	// refusals above are about their defects alone.
	goods := map[string]request{
		"stripe":   stripeReq(stripeOK, stripeSig(now, stripeOK, stripeSecret)),
		"github":   githubReq("d-ok", "{}", githubSig("{}", githubSecret)),
		"standard": {method: http.MethodPost, body: "{}", header: standardHeaders("msg_ok", now, "{}", standardKey)},
		"hmac":     hmacReq("ev-ok", now, "{}", hmacSecret),
	}
	for p, g := range goods {
		r := httptest.NewRequest(g.method, "/hooks/"+p, strings.NewReader(g.body))
		for k, v := range g.header {
			r.Header[k] = v
		}
		w := httptest.NewRecorder()
		handlers[p].ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Errorf("control %s: status %d %q, want 200", p, w.Code, w.Body.String())
		}
	}
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != len(goods) {
		t.Errorf("control effects = %d, want %d", n, len(goods))
	}
}

func TestWebhookConfigRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error { return nil }
	cases := map[string]func() error{
		"stripe without secrets": func() error {
			_, err := webhook.NewStripe(e.inbox, webhook.StripeConfig{}, h)
			return err
		},
		"github without secrets": func() error {
			_, err := webhook.NewGitHub(e.inbox, webhook.GitHubConfig{}, h)
			return err
		},
		"standard with a secret that is not base64": func() error {
			_, err := webhook.NewStandard(e.inbox, webhook.StandardConfig{Secrets: []string{"whsec_!!!"}}, h)
			return err
		},
		"hmac without secrets": func() error {
			_, err := webhook.NewHMAC(e.inbox, webhook.HMACConfig{}, h)
			return err
		},
		"hmac with an id header the signature does not cover": func() error {
			_, err := webhook.NewHMAC(e.inbox, webhook.HMACConfig{HMACVerifier: webhook.HMACVerifier{
				Secrets: []string{"s"}, TimestampHeader: "X-Timestamp", IDHeader: "X-Event-Id"}}, h)
			return err
		},
		"hmac with a signed content that leaves the body out": func() error {
			_, err := webhook.NewHMAC(e.inbox, webhook.HMACConfig{HMACVerifier: webhook.HMACVerifier{
				Secrets: []string{"s"}, SignedContent: "{id}.", IDHeader: "X-Event-Id"}}, h)
			return err
		},
		"negative MaxBodyBytes": func() error {
			_, err := webhook.NewGitHub(e.inbox, webhook.GitHubConfig{Secrets: []string{"s"}, Config: webhook.Config{MaxBodyBytes: -1}}, h)
			return err
		},
		"endpoint with a control char": func() error {
			_, err := webhook.NewGitHub(e.inbox, webhook.GitHubConfig{Secrets: []string{"s"}, Config: webhook.Config{Endpoint: "a\nb"}}, h)
			return err
		},
		"nil inbox": func() error {
			_, err := webhook.NewGitHub(nil, webhook.GitHubConfig{Secrets: []string{"s"}}, h)
			return err
		},
		"nil handler": func() error {
			_, err := webhook.NewGitHub(e.inbox, webhook.GitHubConfig{Secrets: []string{"s"}}, dedupe.HandlerFunc[webhook.Event](nil))
			return err
		},
	}
	fields := map[string]string{
		"stripe without secrets":                              "Secrets",
		"github without secrets":                              "Secrets",
		"standard with a secret that is not base64":           "Secrets",
		"hmac without secrets":                                "Secrets",
		"hmac with an id header the signature does not cover": "IDHeader",
		"hmac with a signed content that leaves the body out": "SignedContent",
		"negative MaxBodyBytes":                               "MaxBodyBytes",
		"endpoint with a control char":                        "Scope",
		"nil inbox":                                           "inbox",
		"nil handler":                                         "handler",
	}
	for name, call := range cases {
		err := call()
		if !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
		// The webhook's own fields are a *dedupe.ConfigError; what the core
		// refuses (nil inbox or handler, a bad scope) stays a
		// *dedupe.ConfigError in the chain.
		var ce *dedupe.ConfigError
		var dce *dedupe.ConfigError
		if !errors.As(err, &ce) && !errors.As(err, &dce) {
			t.Errorf("%s: err %v carries no *ConfigError", name, err)
		}
		if field := configField(err); field != fields[name] {
			t.Errorf("%s: err = %v names field %q, want %q", name, err, field, fields[name])
		}
	}
	e.assertNothingWritten(t)
}
