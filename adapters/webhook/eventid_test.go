package webhook_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/exactlyonce/dedupe/adapters/webhook"
)

// idVerifiers are the verifiers that read the event id from the signed
// JSON body, each with a function that signs a body for it.
func idVerifiers() map[string]struct {
	v    webhook.Verifier
	sign func(body []byte) http.Header
} {
	return map[string]struct {
		v    webhook.Verifier
		sign func(body []byte) http.Header
	}{
		"stripe": {&webhook.StripeVerifier{Secrets: []string{stripeSecret}}, func(body []byte) http.Header {
			return stripeHdr(stripeHeader(now, body, stripeSecret))
		}},
		"hmac IDField": {&webhook.HMACVerifier{Secrets: []string{hmacSecret}}, func(body []byte) http.Header {
			return http.Header{"X-Signature": {hexMAC(hmacSecret, string(body))}}
		}},
	}
}

// TestEventIDReadByExactNameOnce: one signed event, one key. The id is read
// by its exact field name (encoding/json's struct decoding matches names
// case-insensitively, so {"Id":…} was an id and {"id":a,"ID":b} was claimed
// under b), a repeated id field is refused, and so is an id that is not
// valid UTF-8 (invalid bytes, or a lone surrogate escape), which
// encoding/json turns into U+FFFD, so that two signed events claimed one
// key and the second was answered as a duplicate. Each refusal is a 4xx
// *EventError naming the field and its reason.
func TestEventIDReadByExactNameOnce(t *testing.T) {
	t.Parallel()
	accepted := []struct{ body, id string }{
		{`{"id":"evt_1","type":"x"}`, "evt_1"},
		{`{"Id":"evt_other","id":"evt_1"}`, "evt_1"}, // another name; only "id" is the id
		{`{ "id" : "evt_\u00e9\ud83d\ude00\"\\" }`, "evt_é😀\"\\"},
		{"{\"id\":\"evt_\xc3\xa9\"}", "evt_é"},
		{`{"id":"evt_\ufffd"}`, "evt_\ufffd"}, // a replacement character the sender meant
	}
	refused := []struct{ name, body, field, reason string }{
		{"upper case", `{"Id":"evt_e"}`, "id", "missing"},
		{"all caps", `{"ID":"evt_e"}`, "id", "missing"},
		{"repeated", `{"id":"evt_c","id":"evt_d"}`, "id", "more than once"},
		{"repeated, one escaped", `{"id":"evt_c","i\u0064":"evt_d"}`, "id", "more than once"},
		{"invalid byte", "{\"id\":\"evt_\xff\"}", "id", "UTF-8"},
		{"other invalid byte", "{\"id\":\"evt_\xfe\"}", "id", "UTF-8"},
		{"lone high surrogate", `{"id":"evt_\ud800"}`, "id", "UTF-8"},
		{"lone low surrogate", `{"id":"evt_\udc00x"}`, "id", "UTF-8"},
		{"high surrogate then a letter", `{"id":"evt_\ud800\u0041"}`, "id", "UTF-8"},
		{"empty", `{"id":""}`, "id", "missing"},
		{"object", `{"id":{"a":1}}`, "id", "not a string"},
		{"not an object", `["evt_1"]`, "body", "not a JSON object"},
		{"trailing data", `{"id":"evt_1"} {}`, "body", "not a JSON object"},
	}
	for name, tc := range idVerifiers() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, a := range accepted {
				ev, err := tc.v.Verify(tc.sign([]byte(a.body)), []byte(a.body), now)
				if err != nil || ev.ID != a.id || ev.Key != a.id {
					t.Errorf("%s: id %q key %q, %v; want %q", a.body, ev.ID, ev.Key, err, a.id)
				}
			}
			for _, r := range refused {
				_, err := tc.v.Verify(tc.sign([]byte(r.body)), []byte(r.body), now)
				var ee *webhook.EventError
				if !errors.As(err, &ee) || !errors.Is(err, webhook.ErrMalformedEvent) {
					t.Errorf("%s (%q): %v, want an *EventError", r.name, r.body, err)
					continue
				}
				if ee.Field != r.field || !strings.Contains(ee.Reason, r.reason) {
					t.Errorf("%s (%q): refused with field %q reason %q, want %q and a reason saying %q", r.name, r.body, ee.Field, ee.Reason, r.field, r.reason)
				}
			}
			// A number: the generic receiver takes it verbatim; Stripe's ids
			// are strings, and the refusal says so, not "not a JSON object".
			body := []byte(`{"id":123}`)
			ev, err := tc.v.Verify(tc.sign(body), body, now)
			switch {
			case name == "stripe":
				var ee *webhook.EventError
				if !errors.As(err, &ee) || ee.Field != "id" || ee.Reason != "not a string" || strings.Contains(err.Error(), "JSON object") {
					t.Errorf(`{"id":123}: %v; want the id refused as not a string`, err)
				}
			case err != nil || ev.ID != "123":
				t.Errorf(`{"id":123}: id %q, %v; want "123"`, ev.ID, err)
			}
		})
	}
}

// TestHMACIDFieldPathReadExactly: the generic receiver's dotted IDField is
// read the same way at every level: exact names, no repeated member on the
// path, valid UTF-8.
func TestHMACIDFieldPathReadExactly(t *testing.T) {
	t.Parallel()
	v := &webhook.HMACVerifier{Secrets: []string{hmacSecret}, IDField: "data.id"}
	sign := func(body string) http.Header { return http.Header{"X-Signature": {hexMAC(hmacSecret, body)}} }
	cases := []struct{ body, id, reason string }{
		{`{"data":{"id":"e1"}}`, "e1", ""},
		{`{"data":{"id":7}}`, "7", ""},
		{`{"Data":{"id":"e1"}}`, "", "missing"},
		{`{"data":{"ID":"e1"}}`, "", "missing"},
		{`{"data":{"id":"e1"},"data":{"id":"e2"}}`, "", "more than once"},
		{`{"data":{"id":"e1","id":"e2"}}`, "", "more than once"},
		{"{\"data\":{\"id\":\"e\xff\"}}", "", "UTF-8"},
		{`{"data":{"id":"e\udfff"}}`, "", "UTF-8"},
		{`{"data":{"id":true}}`, "", "not a string or a number"},
		{`{"data":"e1"}`, "", "not a JSON object"},
	}
	for _, c := range cases {
		ev, err := v.Verify(sign(c.body), []byte(c.body), now)
		if c.reason == "" {
			if err != nil || ev.ID != c.id {
				t.Errorf("%s: id %q, %v; want %q", c.body, ev.ID, err, c.id)
			}
			continue
		}
		var ee *webhook.EventError
		if !errors.As(err, &ee) || !strings.Contains(ee.Reason, c.reason) {
			t.Errorf("%s: %v; want an *EventError saying %q", c.body, err, c.reason)
		}
	}
}

// FuzzEventIDIsTheSignedBytes: whatever string a signed body carries as its
// id, an accepted id is valid UTF-8 and is exactly what the bytes say: no
// character was replaced in decoding (every U+FFFD in it is one the body
// spelled, as bytes or as an escape), so two bodies whose ids differ in
// their bytes never share a key.
func FuzzEventIDIsTheSignedBytes(f *testing.F) {
	for _, s := range []string{"evt_1", "evt_\xff", "evt_\xfe", `evt_\ud800`, `evt_\ud83d\ude00`, `\ufffd`, "\xef\xbf\xbd", `\u00e9`, `a\"b`} {
		f.Add(s)
	}
	verifiers := idVerifiers()
	f.Fuzz(func(t *testing.T, raw string) {
		body := []byte(`{"id":"` + raw + `"}`)
		for name, tc := range verifiers {
			ev, err := tc.v.Verify(tc.sign(body), body, now)
			var ee *webhook.EventError
			if err != nil {
				if !errors.As(err, &ee) {
					t.Fatalf("%s: %q refused with %v, want an *EventError", name, body, err)
				}
				continue
			}
			if !utf8.ValidString(ev.ID) {
				t.Fatalf("%s: id %q of %q is not valid UTF-8", name, ev.ID, body)
			}
			var std string
			if json.Unmarshal([]byte(`"`+raw+`"`), &std) != nil || std != ev.ID {
				t.Fatalf("%s: id %q of %q, encoding/json reads %q", name, ev.ID, body, std)
			}
			spelled := spelledReplacements(raw)
			if got := strings.Count(ev.ID, "\ufffd"); got != spelled {
				t.Fatalf("%s: id %q of %q holds %d U+FFFD, the body spells %d: a character was replaced", name, ev.ID, body, got, spelled)
			}
		}
	})
}

// spelledReplacements counts the U+FFFD a JSON string's content spells: as
// its UTF-8 bytes, or as the escape \ufffd (an escaped backslash before
// "ufffd" spells none).
func spelledReplacements(raw string) int {
	n := 0
	for i := 0; i < len(raw); i++ {
		switch {
		case strings.HasPrefix(raw[i:], "\ufffd"):
			n++
			i += 2
		case raw[i] == '\\' && i+5 < len(raw) && raw[i+1] == 'u' && strings.EqualFold(raw[i+2:i+6], "fffd"):
			n++
			i += 5
		case raw[i] == '\\':
			i++ // the escaped character
		}
	}
	return n
}
