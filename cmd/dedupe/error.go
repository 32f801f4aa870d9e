package main

import (
	"errors"
	"fmt"
)

// errNoDatabase: neither --database-url nor DATABASE_URL was given.
var errNoDatabase = errors.New("no database: pass --database-url or set DATABASE_URL")

// usageError is a mistake in the command line; it exits with exitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// usagef returns a *usageError.
func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }
