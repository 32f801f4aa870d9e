// Package corelink lends the packages beside the root (the outbox) the few
// things the root package keeps unexported: its database drivers, its error
// translation and its key rules, so that they exist once. The root package
// fills the variables in when it is initialised (corelink.go in the root);
// a package that imports the root, as the outbox does, finds them set.
//
// It imports nothing of the module but internal/driver, which imports
// nothing of it, so the root can import it: the arrow runs from the outbox
// to the root, never back.
package corelink

import "github.com/exactlyonce/dedupe/internal/driver"

// Driver is the root's driver of one dedupe.DB (internal/driver); the
// outbox uses NewBatch, Begin and ListenPool: pgx sends BEGIN and a batch
// in one round trip, database/sql sends BEGIN, then the batch, and cannot
// LISTEN.
type Driver = driver.Driver

// Set by the root package at initialisation.
var (
	// NewDriver returns the driver of db (a dedupe.DB), or the root's
	// *ConfigError when db is nil or of no known kind.
	NewDriver func(db any) (Driver, error)
	// Translate maps a database error to the root's sentinel errors
	// (ErrNotMigrated, ErrInFlight, ErrRetryable, ErrTxEnded), wrapping it.
	Translate func(err error) error
	// ValidatePart checks one part of a key (or an outbox message's ID,
	// topic or key) with the rules of dedupe.Key.Validate; it returns a
	// *dedupe.KeyError naming field.
	ValidatePart func(field, v string) error
)
