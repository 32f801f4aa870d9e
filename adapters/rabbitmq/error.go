package dedupeamqp

import (
	"errors"
	"fmt"
)

// ErrNoKey is matched by every *KeyError: the key function could not produce
// a key for a message. Such a message is recorded under RefusedKey and
// dead-lettered (dedupe.EventRefused).
var ErrNoKey = errors.New("dedupeamqp: message has no usable key")

// KeyError reports a message whose key could not be extracted. It matches
// ErrNoKey and the key function's error.
type KeyError struct {
	Queue string // the queue it was consumed from
	Err   error  // the key function's error
}

// Error implements the error interface.
func (e *KeyError) Error() string {
	return fmt.Sprintf("dedupeamqp: no key for message from queue %q: %v", e.Queue, e.Err)
}

// Unwrap returns ErrNoKey and the key function's error.
func (e *KeyError) Unwrap() []error { return []error{ErrNoKey, e.Err} }

// ErrQueueGone is matched by the error Run returns when the broker cancelled
// its consumer and the queue no longer exists (it was deleted).
var ErrQueueGone = errors.New("dedupeamqp: queue gone")

// ErrChannelClosed is matched by the error Handle returns for a delivery
// that was processed (or not) but could not be settled because its channel
// had died: the broker requeued it, and its redelivery is absorbed by the
// inbox. Nothing is sent on a dead channel.
var ErrChannelClosed = errors.New("dedupeamqp: the delivery's channel is closed")

// ErrDeadLettered is matched by the error Handle returns, and the Err of
// the dedupe.EventTerminated event, of a message that was dead-lettered.
var ErrDeadLettered = errors.New("dedupeamqp: message dead-lettered")

// ErrLastDelivery is matched by the cause recorded for a message the runner
// gave up on at the last delivery the queue allows (Config.DeliveryLimit)
// for a reason other than its handler's failure, such as a shutdown.
var ErrLastDelivery = errors.New("dedupeamqp: last delivery the queue allows")

// ErrUnroutable is matched by the error of a publish (outbox or dead-letter
// copy) that the broker returned because no queue was bound to take it
// (mandatory flag).
var ErrUnroutable = errors.New("dedupeamqp: message unroutable")

// ErrNacked is matched by the error of a publish the broker nacked.
var ErrNacked = errors.New("dedupeamqp: publish nacked by the broker")

// PublishError reports a publish (outbox message or dead-letter copy) that
// failed; it matches ErrUnroutable or ErrNacked when the broker said so.
type PublishError struct {
	Exchange   string
	RoutingKey string
	ReplyCode  int    // the basic.return's code (312 NO_ROUTE), 0 otherwise
	ReplyText  string // the basic.return's text
	Err        error
}

// Error implements the error interface.
func (e *PublishError) Error() string {
	if e.ReplyCode != 0 {
		return fmt.Sprintf("dedupeamqp: publish to exchange %q with key %q returned: %d %s: %v", e.Exchange, e.RoutingKey, e.ReplyCode, e.ReplyText, e.Err)
	}
	return fmt.Sprintf("dedupeamqp: publish to exchange %q with key %q: %v", e.Exchange, e.RoutingKey, e.Err)
}

// Unwrap returns the cause.
func (e *PublishError) Unwrap() error { return e.Err }
