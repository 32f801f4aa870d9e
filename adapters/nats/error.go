package dedupenats

import (
	"errors"
	"fmt"
)

// ErrNoKey is matched by every *KeyError: the key function could not produce
// a key for a message. Such a message is refused (it can never be
// deduplicated): recorded failed under RefusedKey, copied to
// Config.DeadLetterSubject when set, terminated, and reported to the inbox's
// Observer (dedupe.EventRefused).
var ErrNoKey = errors.New("dedupenats: message has no usable key")

// ErrIteratorClosed is returned by Runner.Run when it cannot pull messages
// any more, because the NATS connection was closed or the consumer deleted,
// rather than because its context was cancelled.
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

// ErrDeadLettered is matched by the error Runner.Handle returns, and the
// Err of the dedupe.EventTerminated event, of a message whose copy was
// published to Config.DeadLetterSubject before it was terminated.
var ErrDeadLettered = errors.New("dedupenats: message dead-lettered")

// ErrLastDelivery is matched by the cause recorded for a message the runner
// gave up on at the last delivery the consumer allows (MaxDeliver) for a
// reason other than its handler's failure, such as a shutdown.
var ErrLastDelivery = errors.New("dedupenats: last delivery the consumer allows")
