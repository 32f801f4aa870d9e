package webhook_test

import (
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // a sender that still signs with SHA-1
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/adapters/webhook"
)

const stripeBody = `{"id":"evt_1","object":"event","type":"invoice.paid"}`

func stripeHdr(v string) http.Header { return http.Header{"Stripe-Signature": {v}} }

// wantRefusal checks that err is a *SignatureError with reason want.
func wantRefusal(t *testing.T, name string, err, want error) {
	t.Helper()
	var se *webhook.SignatureError
	if !errors.As(err, &se) || !errors.Is(err, webhook.ErrInvalidSignature) || !errors.Is(err, want) {
		t.Errorf("%s: err = %v, want a *SignatureError matching %v", name, err, want)
	}
}

func TestStripeVerify(t *testing.T) {
	t.Parallel()
	v := &webhook.StripeVerifier{Secrets: []string{"whsec_new", "whsec_old"}}
	body := []byte(stripeBody)

	ok := map[string]string{
		"current secret":         stripeHeader(now, body, "whsec_new"),
		"previous secret":        stripeHeader(now, body, "whsec_old"),
		"two v1, second valid":   stripeHeader(now, body, "whsec_unknown", "whsec_old"),
		"v0 and spaces ignored":  strings.ReplaceAll(stripeHeader(now, body, "whsec_new"), ",", " , ") + ",v0=abcd",
		"tolerance edge, past":   stripeHeader(now.Add(-300*time.Second), body, "whsec_new"),
		"tolerance edge, future": stripeHeader(now.Add(300*time.Second), body, "whsec_new"),
	}
	tpart, v1part, _ := strings.Cut(stripeHeader(now, body, "whsec_new"), ",")
	ok["upper-case hex"] = tpart + "," + strings.Replace(strings.ToUpper(v1part), "V1=", "v1=", 1)
	ok["undecodable v1 then valid"] = tpart + ",v1=zz," + v1part
	for name, h := range ok {
		ev, err := v.Verify(stripeHdr(h), body, now)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if ev.ID != "evt_1" || ev.Type != "invoice.paid" || !ev.Timestamp.Equal(time.Unix(mustTS(t, h), 0)) {
			t.Errorf("%s: event = %+v", name, ev)
		}
	}

	refused := map[string]struct {
		header string
		body   string
		want   error
	}{
		"tampered body":         {stripeHeader(now, body, "whsec_new"), strings.Replace(stripeBody, "paid", "void", 1), webhook.ErrSignatureMismatch},
		"unknown secret":        {stripeHeader(now, body, "whsec_other"), stripeBody, webhook.ErrSignatureMismatch},
		"signed other time":     {strings.Replace(stripeHeader(now, body, "whsec_new"), "t="+strconv.FormatInt(now.Unix(), 10), "t="+strconv.FormatInt(now.Unix()-1, 10), 1), stripeBody, webhook.ErrSignatureMismatch},
		"one second too old":    {stripeHeader(now.Add(-301*time.Second), body, "whsec_new"), stripeBody, webhook.ErrStaleTimestamp},
		"one second too new":    {stripeHeader(now.Add(301*time.Second), body, "whsec_new"), stripeBody, webhook.ErrStaleTimestamp},
		"missing header":        {"", stripeBody, webhook.ErrMissingSignature},
		"no v1":                 {"t=" + strconv.FormatInt(now.Unix(), 10) + ",v0=00", stripeBody, webhook.ErrMissingSignature},
		"no t":                  {"v1=" + strings.Repeat("00", 32), stripeBody, webhook.ErrMalformedSignature},
		"t not a number":        {"t=soon,v1=" + strings.Repeat("00", 32), stripeBody, webhook.ErrMalformedSignature},
		"item without equals":   {"t=1,v1", stripeBody, webhook.ErrMalformedSignature},
		"repeated t":            {"t=1,t=2,v1=" + strings.Repeat("00", 32), stripeBody, webhook.ErrMalformedSignature},
		"sha256 of body only":   {"t=" + strconv.FormatInt(now.Unix(), 10) + ",v1=" + hex.EncodeToString(hmacSHA256([]byte("whsec_new"), body)), stripeBody, webhook.ErrSignatureMismatch},
		"truncated signature":   {stripeHeader(now, body, "whsec_new")[:40], stripeBody, webhook.ErrMalformedSignature},
		"negative t":            {"t=-5,v1=" + strings.Repeat("00", 32), stripeBody, webhook.ErrMalformedSignature},
		"signature as v2 field": {strings.Replace(stripeHeader(now, body, "whsec_new"), "v1=", "v2=", 1), stripeBody, webhook.ErrMissingSignature},
	}
	for name, c := range refused {
		_, err := v.Verify(stripeHdr(c.header), []byte(c.body), now)
		wantRefusal(t, name, err, c.want)
	}

	var te *webhook.TimestampError
	_, err := v.Verify(stripeHdr(stripeHeader(now.Add(-time.Hour), body, "whsec_new")), body, now)
	if !errors.As(err, &te) || te.Tolerance != webhook.DefaultTolerance || te.Now.Sub(te.Timestamp) != time.Hour {
		t.Errorf("stale: %v, want a *TimestampError one hour old", err)
	}

	// Custom tolerance.
	short := &webhook.StripeVerifier{Secrets: []string{"whsec_new"}, Tolerance: 10 * time.Second}
	if _, err := short.Verify(stripeHdr(stripeHeader(now.Add(-11*time.Second), body, "whsec_new")), body, now); !errors.Is(err, webhook.ErrStaleTimestamp) {
		t.Errorf("custom tolerance: %v", err)
	}

	// Authenticated, but no event id: an *EventError, not a signature error.
	for _, b := range []string{`{"type":"x"}`, `not json`, `{"id":""}`} {
		_, err := v.Verify(stripeHdr(stripeHeader(now, []byte(b), "whsec_new")), []byte(b), now)
		var ee *webhook.EventError
		if !errors.As(err, &ee) || !errors.Is(err, webhook.ErrMalformedEvent) || errors.Is(err, webhook.ErrInvalidSignature) {
			t.Errorf("body %q: %v, want an *EventError", b, err)
		}
	}
}

func mustTS(t *testing.T, header string) int64 {
	t.Helper()
	for item := range strings.SplitSeq(header, ",") {
		if k, v, _ := strings.Cut(strings.TrimSpace(item), "="); k == "t" {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no t in %q", header)
	return 0
}

func TestGitHubVerify(t *testing.T) {
	t.Parallel()
	// The example in GitHub's documentation ("Validating webhook deliveries").
	v := &webhook.GitHubVerifier{Secrets: []string{"It's a Secret to Everybody"}}
	h := http.Header{
		"X-Hub-Signature-256": {"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"},
		"X-Github-Delivery":   {"72d3162e-cc78-11e3-81ab-4c9367dc0958"},
		"X-Github-Event":      {"push"},
	}
	ev, err := v.Verify(h, []byte("Hello, World!"), now)
	if err != nil || ev.ID != "72d3162e-cc78-11e3-81ab-4c9367dc0958" || ev.Type != "push" ||
		ev.Key != "sha256:dffd6021bb2bd5b0af676290809ec3a53191dd81c7f70a4b28688a362182986f" { // sha256sum of the body
		t.Fatalf("documented vector: %+v, %v", ev, err)
	}
	if _, err := v.Verify(h, []byte("Hello, World?"), now); !errors.Is(err, webhook.ErrSignatureMismatch) {
		t.Errorf("tampered: %v", err)
	}

	rot := &webhook.GitHubVerifier{Secrets: []string{"new", "old"}}
	body := []byte(`{"zen":"Keep it logically awesome."}`)
	for _, sig := range []string{githubHeader("new", body), githubHeader("old", body), "SHA256=" + strings.ToUpper(githubHeader("old", body)[7:])} {
		h := http.Header{"X-Hub-Signature-256": {sig}, "X-Github-Delivery": {"d-1"}}
		if _, err := rot.Verify(h, body, now); err != nil {
			t.Errorf("rotation %q: %v", sig, err)
		}
	}
	// A stale-looking delivery is fine: GitHub signs no timestamp.
	if _, err := rot.Verify(http.Header{"X-Hub-Signature-256": {githubHeader("new", body)}, "X-Github-Delivery": {"d-1"}}, body, now.Add(24*time.Hour)); err != nil {
		t.Errorf("no tolerance for GitHub: %v", err)
	}

	refused := map[string]struct {
		sig  string
		want error
	}{
		"missing":         {"", webhook.ErrMissingSignature},
		"sha1 header":     {"sha1=" + strings.Repeat("0", 40), webhook.ErrMalformedSignature},
		"no prefix":       {githubHeader("new", body)[7:], webhook.ErrMalformedSignature},
		"short digest":    {githubHeader("new", body)[:60], webhook.ErrMalformedSignature},
		"not hex":         {"sha256=" + strings.Repeat("g", 64), webhook.ErrMalformedSignature},
		"unknown secret":  {githubHeader("other", body), webhook.ErrSignatureMismatch},
		"other body":      {githubHeader("new", []byte("{}")), webhook.ErrSignatureMismatch},
		"flipped last ch": {githubHeader("new", body)[:70] + flip(githubHeader("new", body)[70:]), webhook.ErrSignatureMismatch},
	}
	for name, c := range refused {
		_, err := rot.Verify(http.Header{"X-Hub-Signature-256": {c.sig}, "X-Github-Delivery": {"d-1"}}, body, now)
		wantRefusal(t, name, err, c.want)
	}
	_, err = rot.Verify(http.Header{"X-Hub-Signature-256": {githubHeader("new", body)}}, body, now)
	if !errors.Is(err, webhook.ErrMalformedEvent) {
		t.Errorf("no delivery id: %v", err)
	}
}

func flip(s string) string {
	if s[len(s)-1] == '0' {
		return s[:len(s)-1] + "1"
	}
	return s[:len(s)-1] + "0"
}

func TestStandardVerify(t *testing.T) {
	t.Parallel()
	// The test vector of the Standard Webhooks reference libraries.
	v := &webhook.StandardVerifier{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}
	h := http.Header{
		"Webhook-Id":        {"msg_p5jXN8AQM9LWM0D4loKWxJek"},
		"Webhook-Timestamp": {"1614265330"},
		"Webhook-Signature": {"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
	}
	body := []byte(`{"test": 2432232314}`)
	at := time.Unix(1614265330, 0)
	if ev, err := v.Verify(h, body, at.Add(time.Minute)); err != nil || ev.ID != "msg_p5jXN8AQM9LWM0D4loKWxJek" || !ev.Timestamp.Equal(at) {
		t.Fatalf("reference vector: %+v, %v", ev, err)
	}
	if _, err := v.Verify(h, body, at.Add(301*time.Second)); !errors.Is(err, webhook.ErrStaleTimestamp) {
		t.Errorf("reference vector, late: %v", err)
	}

	newS, oldS := "whsec_"+base64.StdEncoding.EncodeToString([]byte("new key material 0123456789")), "whsec_"+base64.StdEncoding.EncodeToString([]byte("old key"))
	rot := &webhook.StandardVerifier{Secrets: []string{newS, oldS}}
	body = []byte(`{"type":"user.created","data":{"id":"u_1"}}`)
	hdr := func(id string, ts time.Time, sig string) http.Header {
		return http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {strconv.FormatInt(ts.Unix(), 10)}, "Webhook-Signature": {sig}}
	}
	ok := map[string]http.Header{
		"new secret":         hdr("msg_1", now, standardHeader(newS, "msg_1", now, body)),
		"old secret":         hdr("msg_1", now, standardHeader(oldS, "msg_1", now, body)),
		"several signatures": hdr("msg_1", now, "v1,AAAA "+standardHeader(oldS, "msg_1", now, body)+" v1a,ignored"),
		"edge past":          hdr("msg_1", now.Add(-300*time.Second), standardHeader(newS, "msg_1", now.Add(-300*time.Second), body)),
		"edge future":        hdr("msg_1", now.Add(300*time.Second), standardHeader(newS, "msg_1", now.Add(300*time.Second), body)),
		"svix headers": {
			"Svix-Id": {"msg_1"}, "Svix-Timestamp": {strconv.FormatInt(now.Unix(), 10)},
			"Svix-Signature": {standardHeader(newS, "msg_1", now, body)},
		},
	}
	for name, h := range ok {
		ev, err := rot.Verify(h, body, now)
		if err != nil || ev.ID != "msg_1" || ev.Type != "user.created" {
			t.Errorf("%s: %+v, %v", name, ev, err)
		}
	}
	refused := map[string]struct {
		h    http.Header
		want error
	}{
		"tampered body":     {hdr("msg_1", now, standardHeader(newS, "msg_1", now, []byte("{}"))), webhook.ErrSignatureMismatch},
		"id swapped":        {hdr("msg_2", now, standardHeader(newS, "msg_1", now, body)), webhook.ErrSignatureMismatch},
		"too old":           {hdr("msg_1", now.Add(-301*time.Second), standardHeader(newS, "msg_1", now.Add(-301*time.Second), body)), webhook.ErrStaleTimestamp},
		"too new":           {hdr("msg_1", now.Add(301*time.Second), standardHeader(newS, "msg_1", now.Add(301*time.Second), body)), webhook.ErrStaleTimestamp},
		"no signature":      {http.Header{"Webhook-Id": {"msg_1"}, "Webhook-Timestamp": {"1"}}, webhook.ErrMissingSignature},
		"no id":             {http.Header{"Webhook-Timestamp": {"1"}, "Webhook-Signature": {"v1,AAAA"}}, webhook.ErrMissingSignature},
		"no timestamp":      {http.Header{"Webhook-Id": {"msg_1"}, "Webhook-Signature": {"v1,AAAA"}}, webhook.ErrMissingSignature},
		"bad timestamp":     {hdr("msg_1", now, "v1,AAAA").Clone(), webhook.ErrMalformedSignature},
		"only v1a":          {hdr("msg_1", now, "v1a,AAAA"), webhook.ErrMissingSignature},
		"no comma":          {hdr("msg_1", now, "v1AAAA"), webhook.ErrMalformedSignature},
		"not base64":        {hdr("msg_1", now, "v1,!!!"), webhook.ErrMalformedSignature},
		"unknown secret":    {hdr("msg_1", now, standardHeader("whsec_"+base64.StdEncoding.EncodeToString([]byte("x")), "msg_1", now, body)), webhook.ErrSignatureMismatch},
		"too many versions": {hdr("msg_1", now, strings.Repeat("v1,AAAA ", 40)), webhook.ErrMalformedSignature},
	}
	refused["bad timestamp"].h.Set("Webhook-Timestamp", "12:00")
	for name, c := range refused {
		_, err := rot.Verify(c.h, body, now)
		wantRefusal(t, name, err, c.want)
	}
}

func TestHMACVerify(t *testing.T) {
	t.Parallel()
	body := []byte(`{"event":{"id":"e-9","kind":"paid"}}`)
	sha1mac := func(key string, msg []byte) []byte {
		m := hmac.New(sha1.New, []byte(key))
		m.Write(msg)
		return m.Sum(nil)
	}
	cases := map[string]struct {
		v       webhook.HMACVerifier
		h       http.Header
		wantID  string
		wantTyp string
	}{
		"hex sha256, id from JSON path": {
			v:      webhook.HMACVerifier{Secrets: []string{"s"}, IDField: "event.id", TypeField: "event.kind"},
			h:      http.Header{"X-Signature": {hex.EncodeToString(hmacSHA256([]byte("s"), body))}},
			wantID: "e-9", wantTyp: "paid",
		},
		"base64 sha1 with prefix, signed id from header, rotated secret": {
			v: webhook.HMACVerifier{Name: "acme", Secrets: []string{"new", "old"}, SignatureHeader: "x-acme-signature",
				Prefix: "sha1=", Hash: sha1.New, Encoding: webhook.EncodingBase64, SignedContent: "{id}:{body}",
				IDHeader: "X-Acme-Id", TypeHeader: "X-Acme-Type"},
			h: http.Header{"X-Acme-Signature": {"SHA1=" + base64.StdEncoding.EncodeToString(sha1mac("old", append([]byte("a-1:"), body...)))},
				"X-Acme-Id": {"a-1"}, "X-Acme-Type": {"ping"}},
			wantID: "a-1", wantTyp: "ping",
		},
		"slack-like layout": {
			v: webhook.HMACVerifier{Secrets: []string{"s"}, Prefix: "v0=", SignedContent: "v0:{timestamp}:{body}",
				TimestampHeader: "X-Slack-Request-Timestamp", IDField: "event.id"},
			h: http.Header{"X-Slack-Request-Timestamp": {strconv.FormatInt(now.Unix(), 10)},
				"X-Signature": {"v0=" + hex.EncodeToString(hmacSHA256([]byte("s"), []byte("v0:"+strconv.FormatInt(now.Unix(), 10)+":"+string(body))))}},
			wantID: "e-9",
		},
		"base64url with timestamp": {
			v: webhook.HMACVerifier{Secrets: []string{"s"}, Encoding: webhook.EncodingBase64URL, TimestampHeader: "X-Timestamp", IDField: "event.id"},
			h: http.Header{"X-Timestamp": {strconv.FormatInt(now.Unix()-300, 10)},
				"X-Signature": {base64.RawURLEncoding.EncodeToString(hmacSHA256([]byte("s"), []byte(strconv.FormatInt(now.Unix()-300, 10)+"."+string(body))))}},
			wantID: "e-9",
		},
	}
	for name, c := range cases {
		ev, err := c.v.Verify(c.h, body, now)
		if err != nil || ev.ID != c.wantID || ev.Key != c.wantID || ev.Type != c.wantTyp {
			t.Errorf("%s: %+v, %v", name, ev, err)
		}
	}
	v := webhook.HMACVerifier{Secrets: []string{"s"}, TimestampHeader: "X-Timestamp", IDField: "event.id"}
	sign := func(ts int64, b []byte) http.Header {
		t := strconv.FormatInt(ts, 10)
		return http.Header{"X-Timestamp": {t}, "X-Signature": {hex.EncodeToString(hmacSHA256([]byte("s"), []byte(t+"."+string(b))))}}
	}
	wantRefusal(t, "stale", second(v.Verify(sign(now.Unix()-301, body), body, now)), webhook.ErrStaleTimestamp)
	wantRefusal(t, "tampered", second(v.Verify(sign(now.Unix(), body), []byte(`{"event":{"id":"e-10"}}`), now)), webhook.ErrSignatureMismatch)
	wantRefusal(t, "no timestamp", second(v.Verify(http.Header{"X-Signature": {"00"}}, body, now)), webhook.ErrMissingSignature)
	wantRefusal(t, "not hex", second(v.Verify(http.Header{"X-Timestamp": {"1"}, "X-Signature": {"xyz"}}, body, now)), webhook.ErrMalformedSignature)
	other := []byte(`{"event":{"kind":"no id"}}`)
	if _, err := v.Verify(sign(now.Unix(), other), other, now); !errors.Is(err, webhook.ErrMalformedEvent) {
		t.Errorf("no id: %v", err)
	}
}

func second(_ webhook.Event, err error) error { return err }
