package dedupekafka

import (
	"errors"
	"fmt"
)

// ErrNoGroup is returned by New and NewBatch when the reader configuration
// has no GroupID: without a group there are no committed offsets to move
// after the database commit, and no group id to default the scope to.
var ErrNoGroup = errors.New("dedupekafka: reader config has no GroupID")

// ErrMissingKey: a message carries none of Config.KeyHeaders (and
// Config.OffsetKeyFallback is off). It is refused: recorded failed under
// RefusedKey and dead-lettered. The runner's error wraps it in
// dedupe.ErrNoKey.
var ErrMissingKey = errors.New("dedupekafka: message has none of the key headers")

// ErrDeadLetter is matched by every *DeadLetterError.
var ErrDeadLetter = errors.New("dedupekafka: dead-letter write failed")

// ErrPartitionPaused: a partition stopped because a given-up message's
// dead-letter write failed Config.DeadLetterAttempts times. It resumes when
// the group next assigns it (a rebalance or a restart), at the message.
var ErrPartitionPaused = errors.New("dedupekafka: partition paused: a dead-letter write kept failing")

// DeadLetterError reports (in the runner's log) that a given-up message could
// not be written to the dead-letter topic. The write is retried up to
// Config.DeadLetterAttempts times; the message's offset is not committed
// until it succeeds, and its partition pauses when the attempts are used up.
type DeadLetterError struct {
	Topic     string
	Partition int
	Offset    int64
	Attempt   int // 1 for the first try
	Err       error
}

// Error implements the error interface.
func (e *DeadLetterError) Error() string {
	return fmt.Sprintf("dedupekafka: dead-letter %s/%d@%d (attempt %d): %v", e.Topic, e.Partition, e.Offset, e.Attempt, e.Err)
}

// Unwrap returns ErrDeadLetter and the writer's error.
func (e *DeadLetterError) Unwrap() []error { return []error{ErrDeadLetter, e.Err} }
