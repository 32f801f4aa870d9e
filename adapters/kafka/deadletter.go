package dedupekafka

import (
	"context"
	"strconv"

	"github.com/segmentio/kafka-go"
)

// Headers added to a dead-lettered message, next to its own.
const (
	HeaderDeadLetterTopic     = "dedupe-origin-topic"
	HeaderDeadLetterPartition = "dedupe-origin-partition"
	HeaderDeadLetterOffset    = "dedupe-origin-offset"
	HeaderDeadLetterError     = "dedupe-error"
)

// giveUp ends the processing of msg without effects: its key is already
// marked failed (or cannot be used); it is logged, written to the dead-letter
// topic when one is configured (retrying until that succeeds), and its offset
// may then be committed. It reports false only when ctx ended first.
func (r *Runner) giveUp(ctx context.Context, msg kafka.Message, cause error) bool {
	r.cfg.Logger.ErrorContext(ctx, "dedupekafka: giving up on message",
		"topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "err", cause)
	if r.cfg.DeadLetter != nil {
		dl := DeadLetterMessage(msg, cause)
		backoff := r.cfg.RetryBackoff
		for {
			err := r.cfg.DeadLetter.WriteMessages(ctx, dl)
			if err == nil {
				r.stats.deadLettered.Add(1)
				break
			}
			if ctx.Err() != nil {
				return false
			}
			r.cfg.Logger.ErrorContext(ctx, "dedupekafka: dead-letter write failed, retrying", "err", deadLetterError(msg, err))
			if !sleep(ctx, backoff) {
				return false
			}
			backoff = min(2*backoff, r.cfg.MaxRetryBackoff)
		}
	}
	r.stats.givenUp.Add(1)
	return true
}

// DeadLetterMessage returns the message written to the dead-letter topic for
// msg: the same key, value and headers, plus headers naming the origin and
// the error. Topic is left empty for the writer's own.
func DeadLetterMessage(msg kafka.Message, cause error) kafka.Message {
	headers := make([]kafka.Header, 0, len(msg.Headers)+4)
	headers = append(headers, msg.Headers...)
	headers = append(headers,
		kafka.Header{Key: HeaderDeadLetterTopic, Value: []byte(msg.Topic)},
		kafka.Header{Key: HeaderDeadLetterPartition, Value: []byte(strconv.Itoa(msg.Partition))},
		kafka.Header{Key: HeaderDeadLetterOffset, Value: []byte(strconv.FormatInt(msg.Offset, 10))},
		kafka.Header{Key: HeaderDeadLetterError, Value: []byte(cause.Error())},
	)
	return kafka.Message{Key: msg.Key, Value: msg.Value, Headers: headers}
}
