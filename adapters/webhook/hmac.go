package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
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
// for the responses. h receives the inbox driver's transaction: pgx.Tx, or
// *sql.Tx for an inbox over dedupe.SQL.
func NewHMAC[TTx any](inbox *dedupe.Inbox, cfg HMACConfig, h dedupe.TxHandlerFunc[TTx, Event]) (*Handler, error) {
	v := cfg.HMACVerifier
	return New(inbox, &v, cfg.Config, h)
}

// HMACVerifier verifies a generic HMAC signature header. The MAC covers
// SignedContent: the body, or the body with a timestamp and an event id
// laid out as the sender signs them.
//
// The dedup key is the event id, and it comes only from signed material:
// from the verified JSON body (IDField, the default), or from IDHeader when
// SignedContent covers it ({id}). An IDHeader that the signature does not
// cover is refused by New with a *dedupe.ConfigError: with it, a valid signature
// for one body could claim any id, and the real event of that id would be
// dropped as a duplicate.
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
	// SignedContent is the layout of the bytes the MAC covers: the tokens
	// {body} (the raw body), {timestamp} (TimestampHeader's value) and {id}
	// (IDHeader's value) between literal text, e.g. "{id}.{timestamp}.{body}"
	// or "v0:{timestamp}:{body}". {body} must come last; {timestamp} is
	// required exactly when TimestampHeader is set, {id} exactly when
	// IDHeader is; each is followed by a literal separator, and a delivery
	// whose id contains the separator's first byte is refused, so that the
	// signed bytes decode in one way only. Braces are reserved for the
	// tokens. Defaults to "{timestamp}.{body}" when TimestampHeader is set,
	// else "{body}".
	SignedContent string
	// TimestampHeader, when set, names a header with the send time in Unix
	// seconds; it is then part of the signed content and checked against
	// Tolerance. Defaults to "" (no timestamp).
	TimestampHeader string
	// Tolerance bounds the age (and future skew) of the timestamp. Defaults
	// to 5 minutes.
	Tolerance time.Duration
	// IDHeader names the header carrying the event id, which SignedContent
	// must cover with {id}; see the type's documentation. Defaults to ""
	// (use IDField).
	IDHeader string
	// IDField is the dotted path of the event id in the JSON body, e.g.
	// "id" or "event.id", read when IDHeader is empty. Defaults to "id".
	IDField string
	// TypeHeader names the header carrying the event type. It is not
	// covered by the signature: prefer TypeField when the sender puts the
	// type in the body. Defaults to "" (use TypeField).
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
	_, err := v.check()
	return err
}

// check validates the verifier and returns its signed-content layout.
func (v *HMACVerifier) check() (layout, error) {
	if err := validateSecrets(v.Secrets); err != nil {
		return nil, err
	}
	switch {
	case v.Encoding < EncodingHex || v.Encoding > EncodingBase64URL:
		return nil, &dedupe.ConfigError{Field: "Encoding", Reason: "unknown encoding"}
	case v.Tolerance < 0:
		return nil, &dedupe.ConfigError{Field: "Tolerance", Reason: "must be positive"}
	case strings.ContainsAny(v.name(), ":\x00"):
		return nil, &dedupe.ConfigError{Field: "Name", Reason: "must not contain ':' or NUL"}
	}
	return v.layout()
}

// layout parses SignedContent (or its default) and checks it against the
// headers: every header that feeds the event must be covered by the MAC.
func (v *HMACVerifier) layout() (layout, error) {
	content := v.SignedContent
	switch {
	case content != "":
	case v.TimestampHeader != "":
		content = SignedTimestamp + "." + SignedBody
	default:
		content = SignedBody
	}
	l, err := parseLayout(content)
	if err != nil {
		return nil, err
	}
	switch {
	case v.IDHeader != "" && !l.has(partID):
		return nil, &dedupe.ConfigError{Field: "IDHeader", Reason: "not covered by the signature (SignedContent has no " + SignedID +
			"): a valid signature for one body could claim any id and make the real event of that id a duplicate; " +
			"put " + SignedID + " in SignedContent if the sender signs the id, else leave IDHeader empty and read the id from the verified body with IDField"}
	case v.IDHeader == "" && l.has(partID):
		return nil, &dedupe.ConfigError{Field: "SignedContent", Reason: SignedID + " needs IDHeader"}
	case v.TimestampHeader != "" && !l.has(partTimestamp):
		return nil, &dedupe.ConfigError{Field: "TimestampHeader", Reason: "not covered by the signature (SignedContent has no " + SignedTimestamp +
			"): a replay could carry any timestamp"}
	case v.TimestampHeader == "" && l.has(partTimestamp):
		return nil, &dedupe.ConfigError{Field: "SignedContent", Reason: SignedTimestamp + " needs TimestampHeader"}
	}
	return l, nil
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
	lay, err := v.check()
	if err != nil {
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
	// A signed id is used exactly as it was signed: the key is the signed
	// bytes, never a normalized form of them.
	var signedID string
	if v.IDHeader != "" {
		ih := http.CanonicalHeaderKey(v.IDHeader)
		signedID = header.Get(ih)
		if signedID == "" {
			return Event{}, &SignatureError{Provider: v.name(), Header: ih, Reason: ErrMissingSignature}
		}
		if sep, _ := lay.separator(partID); strings.IndexByte(signedID, sep) >= 0 {
			return Event{}, &SignatureError{Provider: v.name(), Header: ih, Reason: ErrMalformedSignature,
				Detail: fmt.Sprintf("contains %q, the separator after %s", sep, SignedID)}
		}
	}
	hf := v.Hash
	if hf == nil {
		hf = sha256.New
	}
	if err := checkMAC(v.name(), v.sigHeader(), hf, v.Secrets, [][]byte{mac}, lay.parts(signedID, rawTS, body)...); err != nil {
		return Event{}, err
	}
	if rawTS != "" {
		if err := checkTolerance(v.name(), http.CanonicalHeaderKey(v.TimestampHeader), ts, now, v.Tolerance); err != nil {
			return Event{}, err
		}
	}
	ev := Event{Timestamp: ts}
	if v.IDHeader != "" {
		ev.ID = signedID
	} else {
		field := v.IDField
		if field == "" {
			field = "id"
		}
		id, err := jsonID(body, field)
		if err == nil && id == "" {
			err = errMissing
		}
		if err != nil {
			return Event{}, fieldRefusal(v.name(), field, err)
		}
		ev.ID = id
	}
	ev.Key = ev.ID
	if v.TypeHeader != "" {
		ev.Type = strings.TrimSpace(header.Get(v.TypeHeader))
	} else if v.TypeField != "" {
		ev.Type, _ = jsonOptionalString(body, v.TypeField) // informational: a type that cannot be read is left empty
	}
	return ev, nil
}
