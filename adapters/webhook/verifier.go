package webhook

import (
	"crypto/hmac"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultTolerance is how far a signed timestamp may lie from the receiver's
// clock, in either direction, before the delivery is refused as a replay.
const DefaultTolerance = 5 * time.Minute

// maxSignatures bounds how many signatures of one header are compared, so a
// forged header cannot make the receiver do unbounded work.
const maxSignatures = 16

// Verifier authenticates one provider's deliveries. The built-in ones are
// *StripeVerifier, *GitHubVerifier, *StandardVerifier and *HMACVerifier;
// implement it for another provider and pass it to New.
type Verifier interface {
	// Provider names the sender ("stripe"); it is part of the dedup scope.
	Provider() string
	// Verify authenticates the raw body with the request's headers, checks
	// any signed timestamp against now, and only then reads the event id
	// and type. It must not do any I/O. A refusal is a *SignatureError or an
	// *EventError.
	//
	// The returned Event's Key (or its ID, when Key is empty) is the dedup
	// key: it must come only from what the signature covers, never from an
	// unsigned header, or one signed delivery could run again under new
	// keys, or claim another event's key and make that event a duplicate.
	Verify(header http.Header, body []byte, now time.Time) (Event, error)
}

// macOf returns the HMAC of the parts under key.
func macOf(h func() hash.Hash, key []byte, parts ...[]byte) []byte {
	m := hmac.New(h, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// checkMAC accepts a delivery when one of sigs is the HMAC of parts under
// one of keys (several keys while a secret rotates, several signatures while
// the sender rotates), comparing every pair in constant time. Otherwise it
// returns the mismatch *SignatureError of provider's header.
func checkMAC[K string | []byte](provider, header string, h func() hash.Hash, keys []K, sigs [][]byte, parts ...[]byte) error {
	ok := false
	for _, k := range keys {
		want := macOf(h, []byte(k), parts...)
		for _, s := range sigs {
			if hmac.Equal(want, s) {
				ok = true
			}
		}
	}
	if !ok {
		return &SignatureError{Provider: provider, Header: header, Reason: ErrSignatureMismatch}
	}
	return nil
}

// parseUnix parses a decimal Unix timestamp in seconds.
func parseUnix(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > 12 || s[0] == '+' || s[0] == '-' {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// checkTolerance refuses ts when it lies more than tolerance from now in
// either direction. A timestamp exactly tolerance away is accepted.
func checkTolerance(provider, header string, ts, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	d := now.Sub(ts)
	if d > tolerance || d < -tolerance {
		return &SignatureError{Provider: provider, Header: header,
			Reason: &TimestampError{Timestamp: ts, Now: now, Tolerance: tolerance}}
	}
	return nil
}
