package outbox

import (
	"errors"
	"fmt"
)

// Errors of the outbox and its relay.
var (
	// ErrInvalidMessage is matched by every *MessageError: Enqueue refused
	// the message and nothing was written.
	ErrInvalidMessage = errors.New("dedupe: invalid outbox message")
	// ErrRelayRunning: Run was called on a Relay that is already running.
	ErrRelayRunning = errors.New("dedupe: relay already running")
	// ErrPublishFailed is matched by every *PublishError.
	ErrPublishFailed = errors.New("dedupe: outbox publish failed")
)

// MessageError reports why Enqueue refused a message. It matches
// ErrInvalidMessage.
type MessageError struct {
	Field  string // "ID", "Topic", "Key" or "Headers"
	Reason string
}

// Error implements the error interface.
func (e *MessageError) Error() string {
	return fmt.Sprintf("dedupe: invalid outbox message: %s: %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalidMessage.
func (e *MessageError) Unwrap() error { return ErrInvalidMessage }

// PublishError is returned by Relay.Cycle when a cycle published nothing and
// the relay took its failures for a broker outage (see
// RelayConfig.HealthCheck): those messages' attempts were not counted and
// they wait for a later cycle. It matches ErrPublishFailed and unwraps to
// the first failure.
type PublishError struct {
	Failed int   // how many messages failed and were not counted
	Err    error // the first failure
}

// Error implements the error interface.
func (e *PublishError) Error() string {
	return fmt.Sprintf("dedupe: outbox broker unreachable: %d publishes of the cycle failed: %v", e.Failed, e.Err)
}

// Unwrap returns ErrPublishFailed and the first failure.
func (e *PublishError) Unwrap() []error { return []error{ErrPublishFailed, e.Err} }
