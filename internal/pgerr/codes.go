package pgerr

// The SQLSTATEs the core and its drivers act on.
const (
	LockNotAvailable     = "55P03" // lock_timeout: the key is held (ErrInFlight)
	SerializationFailure = "40001"
	DeadlockDetected     = "40P01"
	UndefinedTable       = "42P01" // the inbox table is missing (ErrNotMigrated)
	InFailedTx           = "25P02" // a statement of an aborted transaction
	DivisionByZero       = "22012" // the assertion of the root's sqlStoreResultOrFail
	// The claim's savepoint or transaction is gone when dedupe releases or
	// rolls back to it: the handler ended the transaction behind dedupe's
	// back (and may have begun another).
	NoActiveTx       = "25P01"
	InvalidSavepoint = "3B001"
	// A prepared statement of the direct claim round that went away, or
	// whose result type changed (internal/direct): prepared anew.
	InvalidSQLStatementName = "26000"
	FeatureNotSupported     = "0A000"
)
