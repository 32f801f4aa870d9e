package dedupe

import (
	"crypto/sha1" //nolint:gosec // RFC 9562 name-based UUIDs (version 5) are defined over SHA-1.
	"unicode"
	"unicode/utf8"

	"github.com/exactlyonce/dedupe/internal/uuid"
)

// MaxKeyLen is the longest scope or key accepted, in bytes.
const MaxKeyLen = 255

// Key identifies one logical operation: a message id, a webhook event id, an
// Idempotency-Key. Uniqueness is enforced on (Scope, ID), never on ID alone,
// so two consumer groups, endpoints or tenants never collide or see each
// other's keys.
//
// A key is not a hash of the body (two identical orders are two operations)
// and not a per-attempt request id (a retry must reuse it).
type Key struct {
	// Scope is the namespace of the key: the consumer group, the endpoint or
	// the tenant. Required.
	Scope string
	// ID is the key within the scope. Required.
	ID string
	// Fingerprint is an optional hash of the payload. When both the stored
	// and the presented fingerprint are set and differ, the claim reports
	// OutcomeConflict instead of the stored result. It is not part of the
	// key's identity.
	Fingerprint []byte
}

// String returns "scope/id" for logs and errors.
func (k Key) String() string { return k.Scope + "/" + k.ID }

// Validate checks that the scope and id are non-empty, at most MaxKeyLen
// bytes, valid UTF-8 and free of control characters. It returns a *KeyError.
func (k Key) Validate() error {
	if err := validatePart("scope", k.Scope); err != nil {
		return err
	}
	return validatePart("key", k.ID)
}

func validatePart(field, v string) error {
	var reason error
	switch {
	case v == "":
		reason = ErrKeyEmpty
	case len(v) > MaxKeyLen:
		reason = ErrKeyTooLong
	case !utf8.ValidString(v):
		reason = ErrKeyInvalidChar
	default:
		for _, r := range v {
			if unicode.IsControl(r) {
				reason = ErrKeyInvalidChar
				break
			}
		}
	}
	if reason == nil {
		return nil
	}
	shown := v
	if len(shown) > 64 {
		shown = shown[:64] + "…"
	}
	return &KeyError{Field: field, Value: shown, Reason: reason}
}

// derivedNamespace is the RFC 9562 namespace UUID of dedupe's derived keys.
var derivedNamespace = [16]byte{0x6e, 0x1f, 0x0a, 0x53, 0x8c, 0x2d, 0x4b, 0x7e, 0x9a, 0x31, 0x5d, 0xe0, 0x47, 0xc2, 0x18, 0x9b}

// DeriveKey returns a stable key for one downstream step of the operation k,
// formatted as a name-based UUID (version 5). Send it as the Idempotency-Key
// of a call to an external API: every retry of the whole handler derives the
// same value, so the downstream side deduplicates the call too, closing the
// gap that leaves effects outside the database at-least-once.
//
// The value depends on the scope, the id and step only, never on the attempt.
func DeriveKey(k Key, step string) string {
	h := sha1.New() //nolint:gosec // see import comment
	h.Write(derivedNamespace[:])
	// Length-prefix each part so ("a","bc") and ("ab","c") differ.
	for _, part := range []string{k.Scope, k.ID, step} {
		var n [4]byte
		l := len(part)
		n[0], n[1], n[2], n[3] = byte(l>>24), byte(l>>16), byte(l>>8), byte(l)
		h.Write(n[:])
		h.Write([]byte(part))
	}
	var b [16]byte
	copy(b[:], h.Sum(nil))
	return uuid.Format(b, 5)
}
