package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/exactlyonce/dedupe"
)

// usageError is a mistake in the command line; it exits with exitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// usagef returns a *usageError.
func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// errText is err's message for people, without the library's "dedupe: "
// prefixes (a wrapped sentinel repeats it mid-message): the CLI prefixes
// every message with "dedupe <command>: " already.
func errText(err error) string {
	return strings.ReplaceAll(strings.TrimPrefix(err.Error(), "dedupe: "), ": dedupe: ", ": ")
}

// notFoundError is dedupe.ErrNotFound worded for the CLI: it names what
// is missing, and still matches dedupe.ErrNotFound (exit 3).
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }

func (e *notFoundError) Unwrap() error { return dedupe.ErrNotFound }

// keyNotFound words err for key when it is dedupe.ErrNotFound, and returns
// any other error as it is.
func keyNotFound(key dedupe.Key, err error) error {
	if errors.Is(err, dedupe.ErrNotFound) {
		return &notFoundError{msg: fmt.Sprintf("no such key: scope %q, key %q", key.Scope, key.ID)}
	}
	return err
}

// parkedNotFound words err for the outbox message id when it is
// dedupe.ErrNotFound, and returns any other error as it is.
func parkedNotFound(id string, err error) error {
	if errors.Is(err, dedupe.ErrNotFound) {
		return &notFoundError{msg: fmt.Sprintf("no parked outbox message %q", id)}
	}
	return err
}
