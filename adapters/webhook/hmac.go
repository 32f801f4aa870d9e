package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"hash"
	"net/http"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe"
)

// Encoding is how a generic signature header encodes the MAC.
type Encoding int

// Encodings of HMACVerifier.
const (
	EncodingHex       Encoding = iota // lower or upper case hex
	EncodingBase64                    // standard base64 with padding
	EncodingBase64URL                 // URL-safe base64, padding optional
)

// HMACConfig configures NewHMAC.
type HMACConfig struct {
	HMACVerifier
	Config
}

// NewHMAC returns a Handler for a sender that signs with a plain HMAC in a
// header of its choosing; see HMACVerifier for what is configurable and New
// for the responses.
func NewHMAC(inbox *dedupe.Inbox, cfg HMACConfig, h dedupe.HandlerFunc[Event]) (*Handler, error) {
	v := cfg.HMACVerifier
	return New(inbox, &v, cfg.Config, h)
}

// HMACVerifier verifies a generic HMAC signature header. The MAC covers the
// body, or "<timestamp>.<body>" when TimestampHeader is set.
type HMACVerifier struct {
	// Name is the provider's name in the dedup scope. Defaults to "hmac".
	Name string
	// Secrets are the accepted keys, used as raw bytes. Required.
	Secrets []string
	// SignatureHeader carries the MAC. Defaults to "X-Signature".
	SignatureHeader string
	// Prefix is stripped from the header value before decoding, e.g.
	// "sha256=". It is compared case-insensitively. Defaults to "" (none).
	Prefix string
	// Hash is the HMAC's hash. Defaults to sha256.New.
	Hash func() hash.Hash
	// Encoding of the MAC in the header. Defaults to EncodingHex.
	Encoding Encoding
	// TimestampHeader, when set, names a header with the send time in Unix
	// seconds; it is then part of the signed content and checked against
	// Tolerance. Defaults to "" (no timestamp).
	TimestampHeader string
	// Tolerance bounds the age (and future skew) of the timestamp. Defaults
	// to 5 minutes.
	Tolerance time.Duration
	// IDHeader names the header carrying the event id. Defaults to "" (use
	// IDField).
	IDHeader string
	// IDField is the dotted path of the event id in the JSON body, e.g.
	// "id" or "event.id", read when IDHeader is empty. Defaults to "id".
	IDField string
	// TypeHeader names the header carrying the event type. Defaults to ""
	// (use TypeField).
	TypeHeader string
	// TypeField is the dotted path of the event type in the JSON body, read
	// when TypeHeader is empty. Defaults to "" (no type).
	TypeField string
}

func (v *HMACVerifier) name() string {
	if v.Name == "" {
		return "hmac"
	}
	return v.Name
}

func (v *HMACVerifier) sigHeader() string {
	if v.SignatureHeader == "" {
		return "X-Signature"
	}
	return http.CanonicalHeaderKey(v.SignatureHeader)
}

// Provider returns Name.
func (v *HMACVerifier) Provider() string { return v.name() }

func (v *HMACVerifier) validate() error {
	if err := validateSecrets(v.Secrets); err != nil {
		return err
	}
	switch {
	case v.Encoding < EncodingHex || v.Encoding > EncodingBase64URL:
		return &ConfigError{Field: "Encoding", Reason: "unknown encoding"}
	case v.Tolerance < 0:
		return &ConfigError{Field: "Tolerance", Reason: "must be positive"}
	case strings.ContainsAny(v.name(), ":\x00"):
		return &ConfigError{Field: "Name", Reason: "must not contain ':' or NUL"}
	}
	return nil
}

// decode parses the signature header value into the MAC.
func (v *HMACVerifier) decode(value string) ([]byte, error) {
	bad := func(reason error, detail string) ([]byte, error) {
		return nil, &SignatureError{Provider: v.name(), Header: v.sigHeader(), Reason: reason, Detail: detail}
	}
	value = strings.TrimSpace(value)
	if value == "" {
		return bad(ErrMissingSignature, "")
	}
	if p := v.Prefix; p != "" {
		if len(value) < len(p) || !strings.EqualFold(value[:len(p)], p) {
			return bad(ErrMalformedSignature, "missing prefix "+p)
		}
		value = value[len(p):]
	}
	var (
		mac []byte
		err error
	)
	switch v.Encoding {
	case EncodingBase64:
		mac, err = base64.StdEncoding.DecodeString(value)
	case EncodingBase64URL:
		mac, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(value, "="))
	default:
		mac, err = hex.DecodeString(value)
	}
	if err != nil || len(mac) == 0 {
		return bad(ErrMalformedSignature, "cannot decode the MAC")
	}
	return mac, nil
}

// Verify implements Verifier.
func (v *HMACVerifier) Verify(header http.Header, body []byte, now time.Time) (Event, error) {
	if err := v.validate(); err != nil {
		return Event{}, err
	}
	mac, err := v.decode(header.Get(v.sigHeader()))
	if err != nil {
		return Event{}, err
	}
	var (
		ts    time.Time
		rawTS string
	)
	if v.TimestampHeader != "" {
		th := http.CanonicalHeaderKey(v.TimestampHeader)
		rawTS = strings.TrimSpace(header.Get(th))
		if rawTS == "" {
			return Event{}, &SignatureError{Provider: v.name(), Header: th, Reason: ErrMissingSignature}
		}
		var ok bool
		if ts, ok = parseUnix(rawTS); !ok {
			return Event{}, &SignatureError{Provider: v.name(), Header: th, Reason: ErrMalformedSignature, Detail: "not a Unix time"}
		}
	}
	hf := v.Hash
	if hf == nil {
		hf = sha256.New
	}
	signed := [][]byte{body}
	if rawTS != "" {
		signed = [][]byte{[]byte(rawTS), []byte("."), body}
	}
	if err := checkMAC(v.name(), v.sigHeader(), hf, v.Secrets, [][]byte{mac}, signed...); err != nil {
		return Event{}, err
	}
	if rawTS != "" {
		if err := checkTolerance(v.name(), http.CanonicalHeaderKey(v.TimestampHeader), ts, now, v.Tolerance); err != nil {
			return Event{}, err
		}
	}
	ev := Event{Timestamp: ts}
	if v.IDHeader != "" {
		ev.ID = strings.TrimSpace(header.Get(v.IDHeader))
		if ev.ID == "" {
			return Event{}, &EventError{Provider: v.name(), Field: http.CanonicalHeaderKey(v.IDHeader), Reason: "missing"}
		}
	} else {
		field := v.IDField
		if field == "" {
			field = "id"
		}
		id, ok := jsonField(body, field)
		if !ok || id == "" {
			return Event{}, &EventError{Provider: v.name(), Field: field, Reason: "missing or not a string in the JSON body"}
		}
		ev.ID = id
	}
	ev.Key = ev.ID
	if v.TypeHeader != "" {
		ev.Type = strings.TrimSpace(header.Get(v.TypeHeader))
	} else if v.TypeField != "" {
		ev.Type, _ = jsonField(body, v.TypeField)
	}
	return ev, nil
}
