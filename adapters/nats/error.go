package dedupenats

import (
	"errors"
	"fmt"
)

// ErrNoKey is matched by every *KeyError: the key function could not produce
// a key for a message. Such a message is terminated (it can never be
// deduplicated) and reported to Metrics.
var ErrNoKey = errors.New("dedupenats: message has no usable key")

// ErrIteratorClosed is returned by Runner.Run when the message iterator
// closed under it, typically because the NATS connection was closed, rather
// than because its context was cancelled.
var ErrIteratorClosed = errors.New("dedupenats: message iterator closed")

// KeyError reports a message whose key could not be extracted. It matches
// ErrNoKey and the key function's error.
type KeyError struct {
	Subject string // the message's subject
	Err     error  // the key function's error
}

// Error implements the error interface.
func (e *KeyError) Error() string {
	return fmt.Sprintf("dedupenats: no key for message on %q: %v", e.Subject, e.Err)
}

// Unwrap returns ErrNoKey and the key function's error.
func (e *KeyError) Unwrap() []error { return []error{ErrNoKey, e.Err} }
