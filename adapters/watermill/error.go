package dedupewatermill

import (
	"errors"
	"fmt"
)

// ErrNoKey is matched by every *KeyError: the key function could not
// produce a key for a message. Such a message is refused.
var ErrNoKey = errors.New("dedupewatermill: message has no usable key")

// ErrPoison is matched by the error a handling returns, with
// Config.ReturnPoison, for a message whose key is recorded failed: its
// attempts are used up, its handler returned dedupe.Permanent, or it was
// refused. IsPoison is the filter for Watermill's PoisonQueueWithFilter.
var ErrPoison = errors.New("dedupewatermill: poison message recorded failed")

// ErrNoTx is returned by OutboxPublisher.Publish for a message whose
// context holds no transaction of the middleware.
var ErrNoTx = errors.New("dedupewatermill: no dedupe transaction in the message's context")

// IsPoison reports whether err matches ErrPoison: the filter of
// middleware.PoisonQueueWithFilter that sends only poison to the poison
// queue, and lets the other failures nack for redelivery.
func IsPoison(err error) bool { return errors.Is(err, ErrPoison) }

// KeyError reports a message whose key could not be extracted. It matches
// ErrNoKey and the key function's error.
type KeyError struct {
	UUID string // the message's UUID
	Err  error  // the key function's error
}

// Error implements the error interface.
func (e *KeyError) Error() string {
	return fmt.Sprintf("dedupewatermill: no key for message %q: %v", e.UUID, e.Err)
}

// Unwrap returns ErrNoKey and the key function's error.
func (e *KeyError) Unwrap() []error { return []error{ErrNoKey, e.Err} }
