package webhook

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Sentinel errors. Every refusal of a delivery matches one of them with
// errors.Is; the typed errors below carry the details for errors.As. Config.
// OnError receives them.
var (
	// ErrMethodNotAllowed: the request was not a POST (405).
	ErrMethodNotAllowed = errors.New("webhook: method not allowed")
	// ErrBodyTooLarge is matched by every *BodyTooLargeError (413).
	ErrBodyTooLarge = errors.New("webhook: body too large")
	// ErrBodyRead: the body could not be read (the sender went away) (400).
	ErrBodyRead = errors.New("webhook: body could not be read")

	// ErrInvalidSignature is matched by every *SignatureError: the request
	// is not authenticated, whatever the reason (400).
	ErrInvalidSignature = errors.New("webhook: invalid signature")
	// ErrMissingSignature: the signature header, or a header the signature
	// covers, is absent.
	ErrMissingSignature = errors.New("webhook: missing signature")
	// ErrMalformedSignature: the signature header cannot be parsed.
	ErrMalformedSignature = errors.New("webhook: malformed signature header")
	// ErrSignatureMismatch: no presented signature matches any secret.
	ErrSignatureMismatch = errors.New("webhook: signature mismatch")
	// ErrStaleTimestamp: the signed timestamp lies outside the tolerance,
	// in the past (a replay) or in the future. Matched by *TimestampError.
	ErrStaleTimestamp = errors.New("webhook: timestamp outside tolerance")

	// ErrMalformedEvent is matched by every *EventError: the authenticated
	// body or headers do not yield an event id (400).
	ErrMalformedEvent = errors.New("webhook: malformed event")
)

// BodyTooLargeError reports a body over Config.MaxBodyBytes. It matches
// ErrBodyTooLarge.
type BodyTooLargeError struct {
	Limit int64
	// Declared is the request's Content-Length, or -1 when the body was
	// streamed without one and cut off at the limit.
	Declared int64
}

// Error implements the error interface.
func (e *BodyTooLargeError) Error() string {
	if e.Declared >= 0 {
		return fmt.Sprintf("webhook: body of %d bytes exceeds the limit of %d", e.Declared, e.Limit)
	}
	return fmt.Sprintf("webhook: body exceeds the limit of %d bytes", e.Limit)
}

// Unwrap returns ErrBodyTooLarge.
func (e *BodyTooLargeError) Unwrap() error { return ErrBodyTooLarge }

// SignatureError reports why a delivery was not authenticated. It matches
// ErrInvalidSignature and its Reason (ErrMissingSignature,
// ErrMalformedSignature, ErrSignatureMismatch or ErrStaleTimestamp).
type SignatureError struct {
	Provider string // "stripe", "github", "standard" or the generic name
	Header   string // the header at fault, canonical form
	Reason   error
	Detail   string // a short explanation; never secret material
}

// Error implements the error interface.
func (e *SignatureError) Error() string {
	s := fmt.Sprintf("webhook: %s: %s: %v", e.Provider, e.Header, e.Reason)
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

// Unwrap returns ErrInvalidSignature and the reason.
func (e *SignatureError) Unwrap() []error { return []error{ErrInvalidSignature, e.Reason} }

// TimestampError reports a signed timestamp outside the tolerance. It is the
// Reason of a *SignatureError, matches ErrStaleTimestamp and is reachable
// with errors.As.
type TimestampError struct {
	Timestamp time.Time
	Now       time.Time
	Tolerance time.Duration
}

// Error implements the error interface.
func (e *TimestampError) Error() string {
	return fmt.Sprintf("%v: signed at %s, %s from now, tolerance %s", ErrStaleTimestamp,
		e.Timestamp.UTC().Format(time.RFC3339), e.Now.Sub(e.Timestamp).Round(time.Second), e.Tolerance)
}

// Unwrap returns ErrStaleTimestamp.
func (e *TimestampError) Unwrap() error { return ErrStaleTimestamp }

// EventError reports an authenticated delivery from which no event id (or
// another required field) could be read. It matches ErrMalformedEvent.
type EventError struct {
	Provider string
	Field    string // the header or JSON field, e.g. "X-Github-Delivery" or "id"
	Reason   string
}

// Error implements the error interface.
func (e *EventError) Error() string {
	return fmt.Sprintf("webhook: %s: malformed event: %s: %s", e.Provider, e.Field, e.Reason)
}

// Unwrap returns ErrMalformedEvent.
func (e *EventError) Unwrap() error { return ErrMalformedEvent }

// refusal is the response of a delivery refused before any database work.
// An error of a custom Verifier that matches none of the sentinels is taken
// for a fault of the receiver: 500, so that the provider retries.
func refusal(err error) (status int, reason string) {
	switch {
	case errors.Is(err, ErrMethodNotAllowed):
		return http.StatusMethodNotAllowed, "method not allowed"
	case errors.Is(err, ErrBodyTooLarge):
		return http.StatusRequestEntityTooLarge, "body too large"
	case errors.Is(err, ErrStaleTimestamp):
		return http.StatusBadRequest, "timestamp outside tolerance"
	case errors.Is(err, ErrMissingSignature):
		return http.StatusBadRequest, "missing signature"
	case errors.Is(err, ErrMalformedSignature):
		return http.StatusBadRequest, "malformed signature"
	case errors.Is(err, ErrSignatureMismatch), errors.Is(err, ErrInvalidSignature):
		return http.StatusBadRequest, "invalid signature"
	case errors.Is(err, ErrMalformedEvent):
		return http.StatusBadRequest, "malformed event"
	case errors.Is(err, ErrBodyRead):
		return http.StatusBadRequest, "body could not be read"
	}
	return http.StatusInternalServerError, "verification failed"
}
