package dedupekafka

import (
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
)

// ErrNoGroup is returned by New and NewBatch when the reader is not in a consumer group:
// without a group there are no committed offsets to move after the database
// commit, and no group id to default the scope to.
var ErrNoGroup = errors.New("dedupekafka: reader has no GroupID")

// ErrDeadLetter is matched by every *DeadLetterError.
var ErrDeadLetter = errors.New("dedupekafka: dead-letter write failed")

// DeadLetterError reports (in the runner's log) that a given-up message could
// not be written to the dead-letter topic; the write is retried and the
// message's offset is not committed until it succeeds.
type DeadLetterError struct {
	Topic     string
	Partition int
	Offset    int64
	Err       error
}

// Error implements the error interface.
func (e *DeadLetterError) Error() string {
	return fmt.Sprintf("dedupekafka: dead-letter %s/%d@%d: %v", e.Topic, e.Partition, e.Offset, e.Err)
}

// Unwrap returns ErrDeadLetter and the writer's error.
func (e *DeadLetterError) Unwrap() []error { return []error{ErrDeadLetter, e.Err} }

func deadLetterError(m kafka.Message, err error) error {
	return &DeadLetterError{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Err: err}
}
