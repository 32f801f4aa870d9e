package dedupekafka

import (
	"context"
	"strconv"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// Headers added to a dead-lettered message, next to its own.
const (
	HeaderDeadLetterTopic     = "dedupe-origin-topic"
	HeaderDeadLetterPartition = "dedupe-origin-partition"
	HeaderDeadLetterOffset    = "dedupe-origin-offset"
	HeaderDeadLetterError     = "dedupe-error"
)

// refuse gives up on msg, which has no failed key of its own (it has no
// usable key, or its key completed with another payload): it first records
// RefusedKey(msg) failed in the inbox, with cause, so that the message stays
// visible there whether or not a dead-letter topic is configured, then gives
// up on it. A database failure is retried; the partition waits.
func (r *Runner) refuse(ctx context.Context, msg kafka.Message, cause error) step {
	key := dedupe.Key{Scope: r.cfg.Scope, ID: RefusedKey(msg)}
	r.event(ctx, dedupe.EventRefused, &msg, key, cause, 0, 1)
	backoff := r.cfg.RetryBackoff
	for {
		_, _, err := r.inbox.RecordFailure(ctx, key, dedupe.Permanent(cause))
		if err == nil {
			// Recorded now, or by an earlier delivery of the same message.
			return r.giveUp(ctx, msg, key, cause)
		}
		if ctx.Err() != nil {
			return stepStopped
		}
		r.cfg.Logger.WarnContext(ctx, "dedupekafka: recording a refused message failed, retrying",
			"topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "key", key.ID, "err", err)
		if !sleep(ctx, backoff) {
			return stepStopped
		}
		backoff = min(2*backoff, r.cfg.MaxRetryBackoff)
	}
}

// giveUp ends the processing of msg without effects: its key is already
// marked failed (or refuse recorded it under key; zero for msg's own). It is
// logged and, when a dead-letter writer is configured, written there with up
// to DeadLetterAttempts tries; then its offset may be committed (stepDone).
// If every try fails the partition pauses (stepPaused) so that the offset is
// not committed without the copy.
func (r *Runner) giveUp(ctx context.Context, msg kafka.Message, key dedupe.Key, cause error) step {
	r.cfg.Logger.ErrorContext(ctx, "dedupekafka: giving up on message",
		"topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "err", cause)
	if r.cfg.DeadLetter != nil {
		dl := DeadLetterMessage(msg, cause)
		backoff := r.cfg.RetryBackoff
		for attempt := 1; ; attempt++ {
			err := r.cfg.DeadLetter.WriteMessages(ctx, dl)
			if err == nil {
				r.event(ctx, dedupe.EventDeadLettered, &msg, key, cause, 0, 1)
				break
			}
			if ctx.Err() != nil {
				return stepStopped
			}
			derr := &DeadLetterError{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, Attempt: attempt, Err: err}
			r.event(ctx, dedupe.EventDeadLetterFailed, &msg, key, derr, 0, 1)
			if attempt >= r.cfg.DeadLetterAttempts {
				r.cfg.Logger.ErrorContext(ctx, "dedupekafka: dead-letter write failed; pausing the partition", "err", derr)
				r.event(ctx, dedupe.EventPartitionPaused, &msg, key, derr, 0, 1)
				return stepPaused
			}
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: dead-letter write failed, retrying", "err", derr)
			if !sleep(ctx, backoff) {
				return stepStopped
			}
			backoff = min(2*backoff, r.cfg.MaxRetryBackoff)
		}
	}
	r.event(ctx, dedupe.EventTerminated, &msg, key, cause, 0, 1)
	return stepDone
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
