package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe"
)

// Headers of Standard Webhooks (https://www.standardwebhooks.com). Svix sends
// the same headers prefixed "svix-" instead of "webhook-"; both are read.
const (
	StandardIDHeader        = "Webhook-Id"
	StandardTimestampHeader = "Webhook-Timestamp"
	StandardSignatureHeader = "Webhook-Signature"
)

// StandardSecretPrefix starts a Standard Webhooks secret: "whsec_<base64>".
const StandardSecretPrefix = "whsec_"

// StandardConfig configures NewStandard.
type StandardConfig struct {
	// Secrets are the endpoint's secrets, "whsec_<base64>" (the prefix is
	// optional). A delivery signed by any of them is accepted. Required.
	Secrets []string
	// Tolerance is how far webhook-timestamp may lie from now. Defaults to
	// 5 minutes.
	Tolerance time.Duration
	Config
}

// NewStandard returns a Handler for Standard Webhooks senders (Svix and
// others): it verifies webhook-signature ("v1,<base64>", space-separated)
// over "<webhook-id>.<webhook-timestamp>.<body>", then claims webhook-id and
// runs h with the body's JSON "type" if it has one. See New for the
// responses. h receives the inbox driver's transaction: pgx.Tx, or *sql.Tx
// for an inbox over dedupe.SQL.
func NewStandard[TTx any](inbox *dedupe.Inbox, cfg StandardConfig, h dedupe.TxHandlerFunc[TTx, Event]) (*Handler, error) {
	return New(inbox, &StandardVerifier{Secrets: cfg.Secrets, Tolerance: cfg.Tolerance}, cfg.Config, h)
}

// StandardVerifier verifies Standard Webhooks signatures: HMAC-SHA256 of
// "<id>.<timestamp>.<body>" under the base64-decoded secret.
type StandardVerifier struct {
	// Secrets are the accepted "whsec_<base64>" secrets. Required.
	Secrets []string
	// Tolerance bounds the age (and future skew) of webhook-timestamp.
	// Defaults to 5 minutes.
	Tolerance time.Duration
}

// Provider returns "standard".
func (v *StandardVerifier) Provider() string { return "standard" }

func (v *StandardVerifier) validate() error {
	_, err := v.keys()
	return err
}

// keys validates the verifier and returns the HMAC keys of its secrets.
func (v *StandardVerifier) keys() ([][]byte, error) {
	if err := validateSecrets(v.Secrets); err != nil {
		return nil, err
	}
	if v.Tolerance < 0 {
		return nil, &dedupe.ConfigError{Field: "Tolerance", Reason: "must be positive"}
	}
	keys := make([][]byte, len(v.Secrets))
	for i, s := range v.Secrets {
		k, err := DecodeStandardSecret(s)
		if err != nil {
			return nil, err
		}
		keys[i] = k
	}
	return keys, nil
}

// DecodeStandardSecret returns the HMAC key of a "whsec_<base64>" secret.
// It returns a *dedupe.ConfigError.
func DecodeStandardSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, StandardSecretPrefix))
	if err != nil || len(key) == 0 {
		return nil, &dedupe.ConfigError{Field: "Secrets", Reason: "want whsec_<base64>"}
	}
	return key, nil
}

// ParseStandardSignature parses a webhook-signature value: space-separated
// "<version>,<base64>" entries. It returns the decoded v1 signatures; other
// versions (v1a, asymmetric) are skipped. It returns a *SignatureError.
func ParseStandardSignature(header string) ([][]byte, error) {
	bad := func(reason error, detail string) ([][]byte, error) {
		return nil, &SignatureError{Provider: "standard", Header: StandardSignatureHeader, Reason: reason, Detail: detail}
	}
	fields := strings.Fields(header)
	if len(fields) == 0 {
		return bad(ErrMissingSignature, "")
	}
	if len(fields) > maxSignatures {
		return bad(ErrMalformedSignature, "too many signatures")
	}
	var sigs [][]byte
	for _, f := range fields {
		version, sig, ok := strings.Cut(f, ",")
		if !ok {
			return bad(ErrMalformedSignature, "want v1,<base64>")
		}
		if version != "v1" {
			continue
		}
		mac, err := base64.StdEncoding.DecodeString(sig)
		if err != nil {
			return bad(ErrMalformedSignature, "signature is not base64")
		}
		sigs = append(sigs, mac)
	}
	if len(sigs) == 0 {
		return bad(ErrMissingSignature, "no v1 signature")
	}
	return sigs, nil
}

// standardHeaders returns the id, timestamp and signature headers, from the
// webhook-* set or, when it carries no signature, the svix-* set.
func standardHeaders(h http.Header) (id, ts, sig string) {
	id, ts, sig = h.Get(StandardIDHeader), h.Get(StandardTimestampHeader), h.Get(StandardSignatureHeader)
	if sig == "" && id == "" && ts == "" {
		id, ts, sig = h.Get("Svix-Id"), h.Get("Svix-Timestamp"), h.Get("Svix-Signature")
	}
	return id, ts, sig
}

// Verify implements Verifier.
func (v *StandardVerifier) Verify(header http.Header, body []byte, now time.Time) (Event, error) {
	keys, err := v.keys()
	if err != nil {
		return Event{}, err
	}
	id, rawTS, rawSig := standardHeaders(header)
	missing := func(h string) (Event, error) {
		return Event{}, &SignatureError{Provider: "standard", Header: h, Reason: ErrMissingSignature}
	}
	switch {
	case rawSig == "":
		return missing(StandardSignatureHeader)
	case id == "":
		return missing(StandardIDHeader)
	case rawTS == "":
		return missing(StandardTimestampHeader)
	}
	ts, ok := parseUnix(rawTS)
	if !ok {
		return Event{}, &SignatureError{Provider: "standard", Header: StandardTimestampHeader,
			Reason: ErrMalformedSignature, Detail: "not a Unix time"}
	}
	sigs, err := ParseStandardSignature(rawSig)
	if err != nil {
		return Event{}, err
	}
	if err := checkMAC("standard", StandardSignatureHeader, sha256.New, keys, sigs, []byte(id), []byte("."), []byte(rawTS), []byte("."), body); err != nil {
		return Event{}, err
	}
	if err := checkTolerance("standard", StandardTimestampHeader, ts, now, v.Tolerance); err != nil {
		return Event{}, err
	}
	typ, _ := jsonOptionalString(body, "type")
	return Event{ID: id, Key: id, Type: typ, Timestamp: ts}, nil
}
