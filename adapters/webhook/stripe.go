package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe"
)

// StripeSignatureHeader carries Stripe's signature.
const StripeSignatureHeader = "Stripe-Signature"

// StripeConfig configures NewStripe.
type StripeConfig struct {
	// Secrets are the endpoint's signing secrets ("whsec_…", used verbatim
	// as HMAC keys). A delivery signed by any of them is accepted, so list
	// the old and the new secret while rotating. Required.
	Secrets []string
	// Tolerance is how far the signed timestamp may lie from now. Defaults
	// to 5 minutes.
	Tolerance time.Duration
	Config
}

// NewStripe returns a Handler for Stripe's webhooks: it verifies
// Stripe-Signature (t=…,v1=…) over the raw body, then claims the event's
// JSON "id" and runs h with its "type". See New for the responses. h
// receives the inbox driver's transaction: pgx.Tx, or *sql.Tx for an inbox
// over dedupe.SQL.
func NewStripe[TTx any](inbox *dedupe.Inbox, cfg StripeConfig, h dedupe.TxHandlerFunc[TTx, Event]) (*Handler, error) {
	return New(inbox, &StripeVerifier{Secrets: cfg.Secrets, Tolerance: cfg.Tolerance}, cfg.Config, h)
}

// StripeVerifier verifies Stripe's Stripe-Signature header: an HMAC-SHA256
// of "<t>.<body>" under the endpoint secret, hex-encoded in one or more v1
// fields.
type StripeVerifier struct {
	// Secrets are the accepted signing secrets. Required.
	Secrets []string
	// Tolerance bounds the age (and future skew) of the signed timestamp.
	// Defaults to 5 minutes.
	Tolerance time.Duration
}

// Provider returns "stripe".
func (v *StripeVerifier) Provider() string { return "stripe" }

func (v *StripeVerifier) validate() error {
	if err := validateSecrets(v.Secrets); err != nil {
		return err
	}
	if v.Tolerance < 0 {
		return &dedupe.ConfigError{Field: "Tolerance", Reason: "must be positive"}
	}
	return nil
}

// StripeSignature is a parsed Stripe-Signature header.
type StripeSignature struct {
	Timestamp time.Time
	// RawTimestamp is the t field as sent; it is what the signature covers.
	RawTimestamp string
	// V1 holds the decoded v1 signatures (several while Stripe rotates the
	// endpoint's secret). Other schemes (v0) are ignored.
	V1 [][]byte
}

// ParseStripeSignature parses a Stripe-Signature header value
// ("t=1700000000,v1=<hex>,v1=<hex>,v0=…"). It returns a *SignatureError.
func ParseStripeSignature(header string) (StripeSignature, error) {
	var sig StripeSignature
	bad := func(reason error, detail string) (StripeSignature, error) {
		return StripeSignature{}, &SignatureError{Provider: "stripe", Header: StripeSignatureHeader, Reason: reason, Detail: detail}
	}
	if strings.TrimSpace(header) == "" {
		return bad(ErrMissingSignature, "")
	}
	seen, badV1 := 0, 0
	for item := range strings.SplitSeq(header, ",") {
		k, val, ok := strings.Cut(item, "=")
		if !ok {
			return bad(ErrMalformedSignature, "item without '='")
		}
		if seen++; seen > 2*maxSignatures {
			return bad(ErrMalformedSignature, "too many items")
		}
		switch strings.TrimSpace(k) {
		case "t":
			if sig.RawTimestamp != "" {
				return bad(ErrMalformedSignature, "repeated t")
			}
			ts, ok := parseUnix(val)
			if !ok {
				return bad(ErrMalformedSignature, "t is not a Unix time")
			}
			sig.Timestamp, sig.RawTimestamp = ts, strings.TrimSpace(val)
		case "v1":
			mac, err := hex.DecodeString(strings.TrimSpace(val))
			if err != nil || len(mac) != sha256.Size {
				badV1++ // as Stripe's libraries do: an undecodable v1 matches nothing
				continue
			}
			sig.V1 = append(sig.V1, mac)
		}
	}
	switch {
	case sig.RawTimestamp == "":
		return bad(ErrMalformedSignature, "no t")
	case len(sig.V1) == 0 && badV1 > 0:
		return bad(ErrMalformedSignature, "v1 is not 64 hex digits")
	case len(sig.V1) == 0:
		return bad(ErrMissingSignature, "no v1 signature")
	}
	return sig, nil
}

// Verify implements Verifier.
func (v *StripeVerifier) Verify(header http.Header, body []byte, now time.Time) (Event, error) {
	if err := v.validate(); err != nil {
		return Event{}, err
	}
	sig, err := ParseStripeSignature(header.Get(StripeSignatureHeader))
	if err != nil {
		return Event{}, err
	}
	if err := checkMAC("stripe", StripeSignatureHeader, sha256.New, v.Secrets, sig.V1, []byte(sig.RawTimestamp), []byte("."), body); err != nil {
		return Event{}, err
	}
	if err := checkTolerance("stripe", StripeSignatureHeader, sig.Timestamp, now, v.Tolerance); err != nil {
		return Event{}, err
	}
	// The id is read by its exact name, once, as the bytes signed say:
	// never a field that differs only in case, a repeated one, or one that
	// is not valid UTF-8 (see jsonMember and jsonString).
	raw, err := jsonMember(body, "id")
	var id string
	if err == nil {
		id, err = jsonString(raw)
	}
	if err == nil && id == "" {
		err = errMissing
	}
	if err != nil {
		return Event{}, fieldRefusal("stripe", "id", err)
	}
	typ, err := jsonOptionalString(body, "type")
	if err != nil {
		return Event{}, fieldRefusal("stripe", "type", err)
	}
	return Event{ID: id, Key: id, Type: typ, Timestamp: sig.Timestamp}, nil
}

// validateSecrets refuses an empty list or an empty secret.
func validateSecrets(secrets []string) error {
	if len(secrets) == 0 {
		return &dedupe.ConfigError{Field: "Secrets", Reason: "at least one secret is required"}
	}
	for i, s := range secrets {
		if s == "" {
			return &dedupe.ConfigError{Field: "Secrets", Reason: fmt.Sprintf("secret %d is empty", i)}
		}
	}
	return nil
}
