package dedupe

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/errtext"
	"github.com/exactlyonce/dedupe/internal/pgerr"
	"github.com/exactlyonce/dedupe/internal/sqldb"
)

// Sentinel errors. Every error the package returns for a refusal matches one
// of them with errors.Is; the typed errors below carry the details and are
// reachable with errors.As.
var (
	// ErrInvalidKey is matched by every *KeyError: an empty, too long or
	// otherwise unusable scope or key.
	ErrInvalidKey = errors.New("dedupe: invalid key")
	// ErrKeyEmpty: the scope or key is the empty string.
	ErrKeyEmpty = errors.New("dedupe: key is empty")
	// ErrKeyTooLong: the scope or key is longer than MaxKeyLen bytes.
	ErrKeyTooLong = errors.New("dedupe: key is too long")
	// ErrKeyInvalidChar: the scope or key holds a control character or is
	// not valid UTF-8.
	ErrKeyInvalidChar = errors.New("dedupe: key holds an invalid character")

	// ErrNoKey: the key function of a Consumer could not extract a key from
	// the message. The message can never be deduplicated; treat it as poison.
	ErrNoKey = errors.New("dedupe: message has no usable key")

	// ErrInFlight: another attempt holds the key right now (a live lease, or
	// a concurrent transaction that did not finish within the lock timeout).
	// Retry later; nothing was recorded against the key.
	ErrInFlight = errors.New("dedupe: key is in flight")
	// ErrConflict: the key was already used with a different fingerprint
	// (payload). This is a client bug; the stored result is not returned.
	ErrConflict = errors.New("dedupe: key reused with a different payload")
	// ErrPoisoned: the key is marked failed (max attempts reached or a
	// permanent error) and is no longer retried until an operator releases it.
	ErrPoisoned = errors.New("dedupe: key is marked failed")
	// ErrLeaseLost: a Complete, Fail or Extend was refused because the lease
	// it names is no longer the current one (it expired and another attempt
	// took the key over, or the key was released or purged).
	ErrLeaseLost = errors.New("dedupe: lease lost")
	// ErrNotFound: no row exists for the key.
	ErrNotFound = errors.New("dedupe: key not found")
	// ErrInvalidConfig is matched by every *ConfigError.
	ErrInvalidConfig = errors.New("dedupe: invalid config")
	// ErrNotMigrated: the inbox table does not exist. Run Migrate first.
	ErrNotMigrated = errors.New("dedupe: inbox table missing (run Migrate)")
	// ErrRetryable: the database aborted the transaction with a serialization
	// failure or deadlock; running the whole transaction again is safe.
	ErrRetryable = errors.New("dedupe: transaction must be retried")
	// ErrOutcomeUnknown is matched by every *OutcomeUnknownError: a COMMIT
	// (or an autocommit statement) was sent and its reply was lost, and the
	// library could not learn whether it took effect. It never means "rolled
	// back": do not compensate for the work; deliver the message again, and
	// the inbox absorbs the redelivery if the first did commit.
	ErrOutcomeUnknown = errors.New("dedupe: outcome unknown: the reply to a commit was lost")
	// ErrTxOwned: a handler called Commit or Rollback on the transaction
	// dedupe handed it. The claim and the effects commit together when the
	// handler returns nil; return an error to roll them back.
	ErrTxOwned = errors.New("dedupe: the transaction belongs to dedupe: return nil to commit, an error to roll back")
	// ErrTxEnded: the handler's transaction was ended behind dedupe's back
	// (a COMMIT or ROLLBACK sent as a statement, or through Conn(), perhaps
	// followed by BEGIN), or it is aborted by a failed statement the handler
	// ignored. Nothing is reported as processed: the COMMIT proves that the
	// transaction still holds its claim (ClaimSavepoint). Over pgx the
	// statements sent after the end are refused; a *sql.Tx cannot refuse
	// them, and nothing can refuse the rest of the statement that ended it.
	// So a handler that ended its transaction has its key marked failed
	// (OutcomePoisoned), never run again (see Consumer.Handle).
	ErrTxEnded = errors.New("dedupe: the handler's transaction was ended or aborted behind dedupe's back")
	// ErrReentrant: a handler called Handle (or Claim in a transaction of its
	// own) for the very key it is handling, which would wait on itself
	// forever.
	ErrReentrant = errors.New("dedupe: handler claims its own key again")
	// ErrNotAttempted: BatchConsumer.HandleBatch did not handle this message
	// because an earlier message of the batch failed; deliver it again, in
	// order, after the failed one.
	ErrNotAttempted = errors.New("dedupe: not attempted: an earlier message of the batch failed")
)

// OutcomeUnknownError reports an operation whose reply was lost after the
// server may have applied it. It matches ErrOutcomeUnknown.
type OutcomeUnknownError struct {
	Op  string // "commit", "Begin", "Complete", …
	Key Key
	Err error // the connection error, and the failed resolution if any
}

// Error implements the error interface.
func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("dedupe: outcome of %s for %s unknown (the reply was lost): %s", e.Op, e.Key, bareText(e.Err))
}

// Unwrap returns ErrOutcomeUnknown and the cause.
func (e *OutcomeUnknownError) Unwrap() []error { return []error{ErrOutcomeUnknown, e.Err} }

// KeyError reports why a scope or key was refused. It matches ErrInvalidKey
// and the specific reason (ErrKeyEmpty, ErrKeyTooLong, ErrKeyInvalidChar).
type KeyError struct {
	Field  string // "scope" or "key"
	Value  string // the refused value, truncated to 64 bytes for display
	Reason error  // ErrKeyEmpty, ErrKeyTooLong or ErrKeyInvalidChar
}

// Error implements the error interface.
func (e *KeyError) Error() string {
	return fmt.Sprintf("dedupe: invalid %s %q: %s", e.Field, e.Value, bareText(e.Reason))
}

// Unwrap returns ErrInvalidKey and the reason, so errors.Is matches both.
func (e *KeyError) Unwrap() []error { return []error{ErrInvalidKey, e.Reason} }

// ConfigError reports an invalid configuration field. It matches
// ErrInvalidConfig.
type ConfigError struct {
	Field  string
	Reason string
}

// Error implements the error interface.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("dedupe: invalid config: %s: %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// HandlerError wraps the error a handler returned (or the *PanicError it
// raised). Its claim was rolled back; Poisoned says whether this was the last
// attempt, after which the key is marked failed and no longer retried.
type HandlerError struct {
	Key      Key
	Attempt  int  // the attempt that failed, starting at 1
	Poisoned bool // the key is now marked failed
	// Recorded is true when the failed attempt was counted in the inbox:
	// its record committed. It is false when the attempt is not counted
	// (a shutdown, or a connection lost before the record committed), so
	// the message may run more than MaxAttempts times.
	Recorded bool
	Err      error
}

// Error implements the error interface.
func (e *HandlerError) Error() string {
	suffix := ""
	if e.Poisoned {
		suffix = " (key marked failed)"
	}
	return fmt.Sprintf("dedupe: handler failed for %s on attempt %d%s: %s", e.Key, e.Attempt, suffix, bareText(e.Err))
}

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// Is reports ErrPoisoned for a handler error that exhausted its attempts.
func (e *HandlerError) Is(target error) bool { return target == ErrPoisoned && e.Poisoned }

// PanicError is the error a recovered handler panic becomes.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the goroutine's stack at the panic
}

// Error implements the error interface.
func (e *PanicError) Error() string {
	if err, ok := e.Value.(error); ok {
		return "dedupe: handler panicked: " + bareText(err)
	}
	return fmt.Sprintf("dedupe: handler panicked: %v", e.Value)
}

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// PermanentError marks a handler error that retrying cannot fix (a message
// that can never be processed). The key is marked failed at once.
type PermanentError struct{ Err error }

// Error implements the error interface.
func (e *PermanentError) Error() string { return "dedupe: permanent: " + bareText(e.Err) }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the consumer marks the key failed without
// further attempts. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err or any error it wraps is a *PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// mayHaveApplied reports whether err, returned for a statement (or COMMIT),
// leaves it unknown whether the server applied it (internal/pgerr: the
// connection failed after the request may have been sent). The package's
// own refusals and pgx.ErrNoRows are answers.
func mayHaveApplied(err error) bool {
	return !errors.Is(err, pgx.ErrNoRows) && !isRefusal(err) && pgerr.MayHaveApplied(err)
}

// refusals are the sentinels of answers the server gave (a statement that
// ran and changed nothing, a key in another state): never a lost reply.
var refusals = []error{ErrLeaseLost, ErrNotFound, ErrInFlight, ErrConflict, ErrPoisoned, ErrInvalidKey,
	ErrInvalidConfig, ErrNotMigrated, ErrRetryable, ErrReentrant, ErrTxEnded, ErrTxOwned, ErrOutcomeUnknown}

func isRefusal(err error) bool {
	for _, r := range refusals {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

// translate maps pgx errors onto the package's sentinels, keeping the
// original in the chain so *pgconn.PgError stays reachable with errors.As.
func translate(err error) error {
	if err == nil {
		return nil
	}
	code, ok := pgerr.SQLState(err)
	if !ok {
		if pgerr.IsTxDone(err) {
			return wrap(ErrTxEnded, err)
		}
		return err
	}
	switch code {
	case pgerr.LockNotAvailable:
		return wrap(ErrInFlight, err)
	case pgerr.SerializationFailure, pgerr.DeadlockDetected:
		return wrap(ErrRetryable, err)
	case pgerr.UndefinedTable:
		return wrap(ErrNotMigrated, err)
	case pgerr.NoActiveTx:
		return wrap(errTxIdle, err)
	case pgerr.InvalidSavepoint:
		return wrap(errTxRestarted, err)
	}
	return err
}

// errTxIdle and errTxRestarted are the claim's transaction found ended
// behind dedupe's back by the statement that needs it (the checked COMMIT,
// the rollback to the claim's savepoint): no transaction is open, or
// another one is, begun by the handler after it ended the claim's.
var (
	errTxIdle      = wrap(ErrTxEnded, sqldb.ErrNoTx)
	errTxRestarted = wrap(ErrTxEnded, errors.New("the transaction holding the claim ended and another one is open"))
)

// Every error text of the package starts with "dedupe: " once: an error
// that wraps another of the package's prints the inner one without its
// prefix, so that a chain reads "dedupe: a: b: c" (internal/errtext).

// bareText is err's text without the package's prefix.
func bareText(err error) string { return errtext.Text(err) }

// bare returns err printed without the package's prefix; nil for nil.
func bare(err error) error { return errtext.Bare(err) }

// wrap returns outer: inner, inner printed without the package's prefix.
func wrap(outer, inner error) error { return errtext.Wrap(outer, inner) }
