package httpidem

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
)

// NewKey returns a new random Idempotency-Key: a UUID version 4 (RFC 9562)
// from crypto/rand. Generate one per logical operation and reuse it for
// every retry of that operation.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])      // crypto/rand.Read never fails (Go 1.24+)
	b[6] = (b[6] & 0x0f) | 0x40 // version 4
	b[8] = (b[8] & 0x3f) | 0x80 // RFC 9562 variant
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], b[10:16])
	return string(out[:])
}

// ValidateKey checks an Idempotency-Key: 1 to MaxKeyLen characters of
// printable ASCII (space to tilde). It returns an *Error matching
// ErrKeyInvalid or ErrKeyMissing.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return newError(http.StatusBadRequest, ErrKeyMissing, "", nil)
	case len(key) > MaxKeyLen:
		return newError(http.StatusBadRequest, ErrKeyInvalid, fmt.Sprintf("longer than %d characters", MaxKeyLen), nil)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return newError(http.StatusBadRequest, ErrKeyInvalid, "not printable ASCII", nil)
		}
	}
	return nil
}
