package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/exactlyonce/dedupe"
)

// errNoDatabase: neither --database-url nor DATABASE_URL was given.
var errNoDatabase = errors.New("no database: pass --database-url or set DATABASE_URL")

// usageError is a mistake in the command line; it exits with exitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// usagef returns a *usageError.
func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// errText is err's message for people, without the library's "dedupe: "
// prefix: the CLI prefixes every message with "dedupe <command>: " already.
func errText(err error) string { return strings.TrimPrefix(err.Error(), "dedupe: ") }

// notFoundError is dedupe.ErrNotFound for one key, worded for the CLI; it
// still matches dedupe.ErrNotFound (exit 3).
type notFoundError struct{ key dedupe.Key }

func (e *notFoundError) Error() string {
	return fmt.Sprintf("no such key: scope %q, key %q", e.key.Scope, e.key.ID)
}

func (e *notFoundError) Unwrap() error { return dedupe.ErrNotFound }

// keyNotFound words err for key when it is dedupe.ErrNotFound, and returns
// any other error as it is.
func keyNotFound(key dedupe.Key, err error) error {
	if errors.Is(err, dedupe.ErrNotFound) {
		return &notFoundError{key: key}
	}
	return err
}
