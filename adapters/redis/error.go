package deduperedis

import (
	"errors"
	"fmt"
)

// ErrNoKey is matched by every *KeyError: the key function could not
// produce a key for an entry. Such an entry is refused: recorded failed
// under RefusedKey, copied to Config.DeadLetterStream when set, and
// acknowledged (dedupe.EventRefused, then dedupe.EventTerminated).
var ErrNoKey = errors.New("deduperedis: entry has no usable key")

// ErrTrimmed is matched by the cause recorded, and reported to the
// Observer, for a pending entry whose body was deleted from the stream
// (trimmed with MAXLEN or MINID, or XDEL) before it was acknowledged: Redis
// dropped it from the group's pending list when the runner tried to reclaim
// it (XAUTOCLAIM), and its fields are lost. See the package documentation on
// trimming safely.
var ErrTrimmed = errors.New("deduperedis: pending entry deleted from the stream before it was acknowledged")

// ErrTooManyDeliveries is matched by the cause recorded for an entry the
// group delivered more than Config.MaxDeliveries times: each consumer that
// took it died or stalled before acknowledging it (an entry that crashes its
// consumer, say). Its handler is not run again.
var ErrTooManyDeliveries = errors.New("deduperedis: entry delivered too many times")

// ErrDeadLettered is matched by the error Runner.Handle returns for an
// entry copied to Config.DeadLetterStream before it was acknowledged.
var ErrDeadLettered = errors.New("deduperedis: entry dead-lettered")

// KeyError reports an entry whose key could not be extracted. It matches
// ErrNoKey and the key function's error.
type KeyError struct {
	Stream string // the entry's stream
	ID     string // the entry's id
	Err    error  // the key function's error
}

// Error implements the error interface.
func (e *KeyError) Error() string {
	return fmt.Sprintf("deduperedis: no key for entry %s of %q: %v", e.ID, e.Stream, e.Err)
}

// Unwrap returns ErrNoKey and the key function's error.
func (e *KeyError) Unwrap() []error { return []error{ErrNoKey, e.Err} }
