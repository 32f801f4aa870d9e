package httpidem

import (
	"fmt"
	"net/http"

	"github.com/exactlyonce/dedupe/internal/uuid"
)

// NewKey returns a new random Idempotency-Key: a UUID version 4 (RFC 9562)
// from crypto/rand. Generate one per logical operation and reuse it for
// every retry of that operation.
func NewKey() string { return uuid.New() }

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
