package webhook_test

import (
	"crypto/sha256"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
)

// The seed corpora live in testdata/fuzz/<FuzzName>; `go test` runs them,
// `go test -fuzz=FuzzParseStripeSignature ./adapters/webhook` explores.

// checkParseErr fails unless err is nil or a *SignatureError.
func checkParseErr(t *testing.T, header string, err error) {
	t.Helper()
	var se *webhook.SignatureError
	if err != nil && (!errors.As(err, &se) || !errors.Is(err, webhook.ErrInvalidSignature)) {
		t.Fatalf("header %q: error %v is not a *SignatureError", header, err)
	}
}

func FuzzParseStripeSignature(f *testing.F) {
	f.Add("t=1772366400,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd")
	f.Fuzz(func(t *testing.T, header string) {
		sig, err := webhook.ParseStripeSignature(header)
		checkParseErr(t, header, err)
		if err != nil {
			return
		}
		if sig.RawTimestamp == "" || len(sig.V1) == 0 || len(sig.V1) > 32 {
			t.Fatalf("header %q parsed to %+v", header, sig)
		}
		for _, mac := range sig.V1 {
			if len(mac) != sha256.Size {
				t.Fatalf("header %q: v1 of %d bytes", header, len(mac))
			}
		}
	})
}

func FuzzParseGitHubSignature(f *testing.F) {
	f.Add("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
	f.Fuzz(func(t *testing.T, header string) {
		mac, err := webhook.ParseGitHubSignature(header)
		checkParseErr(t, header, err)
		if err == nil && len(mac) != sha256.Size {
			t.Fatalf("header %q: MAC of %d bytes", header, len(mac))
		}
	})
}

func FuzzParseStandardSignature(f *testing.F) {
	f.Add("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	f.Fuzz(func(t *testing.T, header string) {
		sigs, err := webhook.ParseStandardSignature(header)
		checkParseErr(t, header, err)
		if err == nil && (len(sigs) == 0 || len(sigs) > 16) {
			t.Fatalf("header %q: %d signatures", header, len(sigs))
		}
	})
}

// FuzzVerifiers feeds arbitrary header values and bodies to every verifier
// (none may panic or return an untyped error), then signs the body properly
// and checks that a correct signature is never refused as a signature.
func FuzzVerifiers(f *testing.F) {
	f.Add("t=1,v1=00", "sha256=00", "v1,AAAA", "1614265330", "msg_1", []byte(`{"id":"evt_1","type":"x"}`))
	stripe := &webhook.StripeVerifier{Secrets: []string{stripeSecret}}
	github := &webhook.GitHubVerifier{Secrets: []string{githubSecret}}
	standard := &webhook.StandardVerifier{Secrets: []string{standardSecret}}
	generic := &webhook.HMACVerifier{Secrets: []string{hmacSecret}, Prefix: "sha256=", TimestampHeader: "X-Timestamp", IDField: "a.b"}
	signedID := &webhook.HMACVerifier{Name: "signed", Secrets: []string{hmacSecret}, Prefix: "sha256=",
		SignedContent: "{id}.{timestamp}.{body}", TimestampHeader: "X-Timestamp", IDHeader: "X-Event-Id"}
	verifiers := []webhook.Verifier{stripe, github, standard, generic, signedID}
	f.Fuzz(func(t *testing.T, stripeSig, githubSig, standardSig, ts, id string, body []byte) {
		h := http.Header{}
		h.Set("Stripe-Signature", stripeSig)
		h.Set("X-Hub-Signature-256", githubSig)
		h.Set("X-Signature", githubSig)
		h.Set("X-Github-Delivery", id)
		h.Set("Webhook-Id", id)
		h.Set("Webhook-Timestamp", ts)
		h.Set("X-Timestamp", ts)
		h.Set("Webhook-Signature", standardSig)
		h.Set("X-Event-Id", id)
		for _, v := range verifiers {
			_, err := v.Verify(h, body, now)
			var se *webhook.SignatureError
			var ee *webhook.EventError
			if err != nil && !errors.As(err, &se) && !errors.As(err, &ee) {
				t.Fatalf("%s: untyped error %v", v.Provider(), err)
			}
		}
		// Properly signed, the same bodies pass verification (they may
		// still lack an event id).
		h.Set("Stripe-Signature", stripeHeader(now, body, stripeSecret))
		h.Set("X-Hub-Signature-256", githubHeader(githubSecret, body))
		h.Set("Webhook-Timestamp", strconv.FormatInt(now.Unix(), 10))
		standardID := "msg_fuzz"
		h.Set("Webhook-Id", standardID)
		h.Set("Webhook-Signature", standardHeader(standardSecret, standardID, now, body))
		minute := strconv.FormatInt(now.Add(-time.Minute).Unix(), 10)
		h.Set("X-Timestamp", minute)
		for _, v := range verifiers {
			switch v {
			case generic:
				h.Set("X-Signature", "sha256="+hexMAC(hmacSecret, minute+"."+string(body)))
			case signedID:
				h.Set("X-Signature", "sha256="+hexMAC(hmacSecret, id+"."+minute+"."+string(body)))
			}
			ev, err := v.Verify(h, body, now)
			if v == signedID && (id == "" || strings.Contains(id, ".") || id != h.Get("X-Event-Id")) {
				continue // refused as it must be: no id, or one that holds the separator
			}
			if errors.Is(err, webhook.ErrInvalidSignature) {
				t.Fatalf("%s: correctly signed body refused: %v", v.Provider(), err)
			}
			if v == signedID && err == nil && (ev.ID != id || ev.Key != id) {
				t.Fatalf("signed id %q read as %q, key %q", id, ev.ID, ev.Key)
			}
		}
	})
}

// FuzzHMACSignedContent checks that a layout New accepts binds what it
// signs: a signature made for (id1, body1) never verifies (id2, body2)
// unless they are the same, whatever the layout and the values.
func FuzzHMACSignedContent(f *testing.F) {
	f.Add("{id}.{timestamp}.{body}", "evt_1", "evt_2", []byte(`{"a":1}`), []byte(`{"a":1}`))
	f.Add("{id}.{body}", "a", "a.b", []byte(`b.c`), []byte(`c`))
	f.Add("{id}.{timestamp}.{body}", "a", "a.1772366400", []byte(`1772366400.c`), []byte(`c`))
	f.Add("{id}{body}", "ab", "a", []byte(`c`), []byte(`bc`))
	f.Add("v0:{timestamp}:{body}", "", "", []byte(`x`), []byte(`y`))
	f.Add("{body}", "", "", []byte(`x`), []byte(`x`))
	ts := strconv.FormatInt(now.Unix(), 10)
	render := strings.NewReplacer // the layout as the sender's code would fill it
	f.Fuzz(func(t *testing.T, layout, id1, id2 string, body1, body2 []byte) {
		v := &webhook.HMACVerifier{Secrets: []string{hmacSecret}, SignedContent: layout}
		if strings.Contains(layout, webhook.SignedTimestamp) {
			v.TimestampHeader = "X-Timestamp"
		}
		if strings.Contains(layout, webhook.SignedID) {
			v.IDHeader = "X-Event-Id"
		} else {
			id1, id2 = "", ""
			v.IDField = "id"
		}
		signed := render(webhook.SignedID, id1, webhook.SignedTimestamp, ts, webhook.SignedBody, string(body1)).Replace(layout)
		h := http.Header{"X-Timestamp": {ts}, "X-Signature": {hexMAC(hmacSecret, signed)}}
		if id2 != "" {
			h["X-Event-Id"] = []string{id2} // as sent, not canonicalized by Set
		}
		ev, err := v.Verify(h, body2, now)
		var ce *dedupe.ConfigError
		if errors.As(err, &ce) {
			return // a layout New refuses
		}
		var se *webhook.SignatureError
		var ee *webhook.EventError
		if err != nil && !errors.As(err, &se) && !errors.As(err, &ee) {
			t.Fatalf("layout %q: untyped error %v", layout, err)
		}
		if errors.Is(err, webhook.ErrInvalidSignature) {
			return
		}
		if id1 != id2 || string(body1) != string(body2) {
			t.Fatalf("layout %q: the signature of (%q, %q) verified (%q, %q) as event %+v", layout, id1, body1, id2, body2, ev)
		}
	})
}

func hexMAC(key, msg string) string { return githubHeader(key, []byte(msg))[len("sha256="):] }
