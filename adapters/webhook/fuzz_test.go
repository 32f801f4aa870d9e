package webhook_test

import (
	"crypto/sha256"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

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
		for _, v := range []webhook.Verifier{stripe, github, standard, generic} {
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
		signedID := "msg_fuzz"
		h.Set("Webhook-Id", signedID)
		h.Set("Webhook-Signature", standardHeader(standardSecret, signedID, now, body))
		h.Set("X-Timestamp", strconv.FormatInt(now.Add(-time.Minute).Unix(), 10))
		h.Set("X-Signature", "sha256="+hexMAC(hmacSecret, strconv.FormatInt(now.Add(-time.Minute).Unix(), 10)+"."+string(body)))
		for _, v := range []webhook.Verifier{stripe, github, standard, generic} {
			if _, err := v.Verify(h, body, now); errors.Is(err, webhook.ErrInvalidSignature) {
				t.Fatalf("%s: correctly signed body refused: %v", v.Provider(), err)
			}
		}
	})
}

func hexMAC(key, msg string) string { return githubHeader(key, []byte(msg))[len("sha256="):] }
