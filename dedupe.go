package dedupe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/pgxdriver"
	"github.com/exactlyonce/dedupe/internal/sqldb"
)

// DB is the database of an Inbox or an outbox.Outbox: a pgx pool (*pgxpool.Pool, the
// default and fastest; a *pgx.Conn works too, though it cannot serve
// concurrent calls), or a database/sql handle wrapped with SQL. Any other
// value is refused by New with a *ConfigError.
type DB interface {
	Querier
}

// Querier is a connection, pool or transaction that runs statements; the
// inbox uses it where the caller decides which transaction a write joins.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults of Config.
const (
	DefaultTable          = "dedupe_inbox"
	DefaultLease          = 30 * time.Second
	DefaultRetention      = 7 * 24 * time.Hour
	DefaultMaxAttempts    = 10
	DefaultPurgeBatchSize = 1000
)

// Config configures an Inbox. The zero value is usable: every field has a
// default.
type Config struct {
	// Schema holds the inbox table. Defaults to "" (the connection's
	// search_path).
	Schema string
	// Table is the inbox table's name. Defaults to "dedupe_inbox".
	Table string
	// Lease is how long a leased claim (Begin) is held before another attempt
	// may take it over. Defaults to 30s.
	Lease time.Duration
	// Retention is how long a key is kept after its last write before Purge
	// may delete it. It must outlive the longest redelivery delay of the
	// transport, or a late duplicate is processed again. It should also
	// outlive the longest handling by far: a COMMIT whose reply was lost is
	// resolved by reading the claim's row, and a row absent more than
	// Retention after its claim may have been committed and purged, so that
	// outcome is reported unknown (ErrOutcomeUnknown). Defaults to 7 days.
	Retention time.Duration
	// MaxAttempts is how many failed attempts a key gets before it is marked
	// failed (poison) and no longer retried. Defaults to 10; a negative value
	// means no limit.
	MaxAttempts int
	// PurgeBatchSize bounds the rows deleted per statement by Purge.
	// Defaults to 1000.
	PurgeBatchSize int
	// Clock is a test seam, never a correctness knob: when set, its time
	// stands in for the database server's clock in every lease, expiry,
	// retention and takeover decision, so that a test moves leases without
	// sleeping. Defaults to nil: every such decision is computed by
	// PostgreSQL from its own clock (clock_timestamp()) at the moment the
	// statement runs, so neither the application's clock nor a reading taken
	// before a pool or lock wait can decide who holds a key.
	Clock func() time.Time
	// Logger receives the inbox's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer is told of every claim, handling, lease renewal and purge,
	// for metrics and traces (see Observer and the dedupeotel module; the
	// outbox has its own, outbox.Config.Observer). Defaults to nil: nothing
	// is observed, at no cost.
	Observer Observer
}

// withDefaults returns a copy of c with every zero field defaulted, or a
// *ConfigError.
func (c Config) withDefaults() (Config, error) {
	out := c
	if out.Table == "" {
		out.Table = DefaultTable
	}
	if out.Lease == 0 {
		out.Lease = DefaultLease
	}
	if out.Retention == 0 {
		out.Retention = DefaultRetention
	}
	if out.MaxAttempts == 0 {
		out.MaxAttempts = DefaultMaxAttempts
	}
	if out.PurgeBatchSize == 0 {
		out.PurgeBatchSize = DefaultPurgeBatchSize
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	switch {
	case out.Lease < 0:
		return out, &ConfigError{Field: "Lease", Reason: "must be positive"}
	case out.Retention < 0:
		return out, &ConfigError{Field: "Retention", Reason: "must be positive"}
	case out.Retention < out.Lease:
		return out, &ConfigError{Field: "Retention", Reason: "must be at least Lease"}
	case out.PurgeBatchSize < 0:
		return out, &ConfigError{Field: "PurgeBatchSize", Reason: "must be positive"}
	case len(out.Table) > 55:
		return out, &ConfigError{Field: "Table", Reason: "must be at most 55 bytes (PostgreSQL truncates longer names)"}
	}
	return out, nil
}

// maxAttemptsParam is MaxAttempts as the SQL parameter (0 = no limit).
func (c *Config) maxAttemptsParam() int {
	if c.MaxAttempts < 0 {
		return 0
	}
	return c.MaxAttempts
}

// now is the $1 of every statement that decides by time (see clockParam).
func (c *Config) now() *time.Time { return clockParam(c.Clock) }

// clockParam is the "now" parameter of a statement that decides by time:
// nil, so that the database uses its own clock, unless a test set clock.
func clockParam(clock func() time.Time) *time.Time {
	if clock == nil {
		return nil
	}
	t := clock()
	return &t
}

// Migration returns the migration configuration of the inbox's table: its
// schema and table, the inbox line only. Migrate(ctx, db, cfg.Migration())
// creates what New(db, cfg) uses.
func (c Config) Migration() MigrateConfig {
	return MigrateConfig{Schema: c.Schema, InboxTable: c.Table, Lines: []Line{LineInbox}}
}

// qualify returns the quoted, optionally schema-qualified table.
func qualify(schema, name string) string {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// Inbox claims keys in one inbox table. It is safe for concurrent use; build
// one per configuration and share it.
type Inbox struct {
	db    DB
	drv   driver
	cfg   Config
	q     queries
	table string // quoted and qualified
	// leaseArg and retentionArg are cfg.Lease and cfg.Retention as statement
	// arguments, converted once rather than on every claim.
	leaseArg, retentionArg any
	// direct holds the statements of the direct claim round, nil when the
	// driver cannot send it (driver.go, internal/direct).
	direct *direct.Stmts
	// ahead decides whether a claim sends the read of an existing key with
	// its insert (direct.Ahead).
	ahead direct.Ahead
}

// New returns an Inbox over db; the zero Config is the defaults. New does not
// touch the database; call Migrate once before use (cfg.Migration()).
func New(db DB, cfg Config) (*Inbox, error) {
	drv, err := newDriver(db)
	if err != nil {
		return nil, err
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	table := qualify(c.Schema, c.Table)
	i := &Inbox{db: db, drv: drv, cfg: c, q: newQueries(table), table: table, leaseArg: c.Lease, retentionArg: c.Retention}
	switch d := drv.(type) {
	case *pgxdriver.Driver:
		if d.Direct() {
			i.direct = newDirectStmts(&i.q)
		}
	case *sqldb.Driver:
		i.direct = newDirectStmts(&i.q) // used over pgx's stdlib only
	}
	return i, nil
}

// newDirectStmts are the direct round's statements of an inbox's queries.
func newDirectStmts(q *queries) *direct.Stmts {
	return direct.NewStmts(q.claimInsert, q.peek, sqlTxSettings, sqlSavepoint)
}

// Config returns the inbox's configuration with defaults filled in.
func (i *Inbox) Config() Config { return i.cfg }

// DB returns the database the inbox was built over.
func (i *Inbox) DB() DB { return i.db }

// Outcome is what a claim or a handled message came to.
type Outcome int

// Outcomes.
const (
	// OutcomeNone, the zero value, is no outcome: nothing was decided for the
	// message, because it could not be handled at all (no usable key, a
	// re-entrant call) or the database failed before anything committed.
	// Handle returns it only with an error; redeliver, or treat an invalid
	// key as poison.
	OutcomeNone Outcome = iota
	// OutcomeClaimed: the key was absent (or its previous attempt failed or
	// its lease expired) and is now held by this attempt. For Consumer.Handle:
	// the handler ran and its effects committed.
	OutcomeClaimed
	// OutcomeDuplicate: the key is complete; Claim.Result holds the stored
	// result. Nothing ran.
	OutcomeDuplicate
	// OutcomeInFlight: another attempt holds the key right now. Retry later.
	OutcomeInFlight
	// OutcomeConflict: the key is known with a different fingerprint.
	OutcomeConflict
	// OutcomePoisoned: the key is marked failed and is no longer retried.
	OutcomePoisoned
	// OutcomeRetry: the handler failed, everything was rolled back, and a
	// redelivery will try again (Consumer.Handle; reported to the Observer
	// also for a leased or HTTP handling whose key was released or whose
	// lease was lost).
	OutcomeRetry
	// OutcomeUnknown: the transaction's COMMIT was sent but its reply was
	// lost, and the library could not learn on a fresh connection whether it
	// committed (ErrOutcomeUnknown). Nothing may be assumed either way:
	// redeliver, and the inbox absorbs the redelivery as a duplicate if the
	// first did commit.
	OutcomeUnknown
)

var outcomeNames = [...]string{"none", "claimed", "duplicate", "in_flight", "conflict", "poisoned", "retry", "unknown"}

// String returns the outcome's lower-case name.
func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Err returns the sentinel error matching a refusing outcome (ErrInFlight,
// ErrConflict, ErrPoisoned) and nil for the others.
func (o Outcome) Err() error {
	switch o {
	case OutcomeInFlight:
		return ErrInFlight
	case OutcomeConflict:
		return ErrConflict
	case OutcomePoisoned:
		return ErrPoisoned
	}
	return nil
}

// State is a stored key's state.
type State string

// States of a stored key. An absent key has no row.
const (
	StateInFlight State = "in_flight"
	StateComplete State = "complete"
	StateFailed   State = "failed"
)

// Result is what a completed key stores and a duplicate gets back: for HTTP
// a response, for a consumer whatever the handler chose to record.
type Result struct {
	Status  int
	Headers map[string][]string
	Body    []byte
}

// Claim is the outcome of claiming a key.
type Claim struct {
	Key     Key
	Outcome Outcome
	// Token is the fencing token of this attempt's hold on the key. Complete,
	// Fail and Extend present it; they are refused once another attempt has
	// taken the key over.
	Token int64
	// Attempt is the attempt number, starting at 1.
	Attempt int
	// LockedUntil is the end of the lease on the database's clock (leased
	// mode, or the holder's lease for OutcomeInFlight). Do not compare it
	// with this process's clock; use LeaseLeft.
	LockedUntil time.Time
	// Result is the stored result of a duplicate.
	Result *Result

	pending *Result // set by SetResult inside a Consumer handler
	// sent is when the claim's statement was sent, on this process's
	// monotonic clock, and sentClock the inbox's test clock then (nil
	// without one): the claim's row expires no earlier than Retention after
	// either (Inbox.Resolve).
	sent      time.Time
	sentClock *time.Time
	deadline  time.Time // the lease's end on this process's monotonic clock
	inbox     *Inbox    // the inbox that made the claim (re-entrance check)
	obsDone   func(Outcome, int, error)
}

// observed ends a leased claim's handling for the Observer, once.
func (c *Claim) observed(o Outcome, err error) {
	if c.obsDone != nil {
		c.obsDone(o, c.Attempt, err)
		c.obsDone = nil
	}
}

// settled ends a leased claim's handling for the Observer after Complete or
// Fail returned opErr: with o and cause when it succeeded; as a retry when
// the lease was lost (another attempt took the key over, this one's work
// does not count); as OutcomeUnknown when its outcome could not be learnt.
// Other errors leave the handling open: the caller may still settle it.
func (c *Claim) settled(o Outcome, cause, opErr error) {
	switch {
	case opErr == nil:
		c.observed(o, cause)
	case errors.Is(opErr, ErrLeaseLost):
		c.observed(OutcomeRetry, opErr)
	case errors.Is(opErr, ErrOutcomeUnknown):
		c.observed(OutcomeUnknown, opErr)
	}
}

// LeaseLeft is how long this attempt may still count on its lease: the
// lease the database granted (measured by the database when its statement
// ended), counted down on this process's monotonic clock from the moment the
// request was sent, so it errs early and never trusts the application's wall
// clock. It is 0 for a claim without a lease.
func (c *Claim) LeaseLeft() time.Duration {
	if c.deadline.IsZero() {
		return 0
	}
	return max(time.Until(c.deadline), 0)
}

// setLease records the lease the database reported: left is what remained
// when its statement ended, sent is when this process sent the request.
func (c *Claim) setLease(until *time.Time, left *time.Duration, sent time.Time) {
	if until == nil {
		return
	}
	c.LockedUntil = *until
	if left != nil {
		c.deadline = sent.Add(*left)
	}
}

// DerivedKey returns a stable key for one downstream step of this claim (see
// DeriveKey): send it as the Idempotency-Key of an external call so that a
// retry of the whole handler reuses it.
func (c *Claim) DerivedKey(step string) string { return DeriveKey(c.Key, step) }

// SetResult records r to be stored with the key when the handler's
// transaction commits (Consumer.Handle and the adapters do this), so that
// duplicates get it back. It costs one more
// statement in the transaction; without it nothing extra runs.
func (c *Claim) SetResult(r Result) { c.pending = &r }

// Record is a stored key as operators see it.
type Record struct {
	Key         Key
	State       State
	Attempts    int
	Token       int64
	LockedUntil *time.Time
	Result      *Result
	LastError   string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	ExpiresAt   time.Time
	// ReadAt is the database's time when the row was read: compare
	// LockedUntil and ExpiresAt with it, not with the local clock.
	ReadAt time.Time
}

// scanRecord scans recordColumns.
func scanRecord(row pgx.Row) (*Record, error) {
	d := &recordDest{}
	if err := row.Scan(d.dest()...); err != nil {
		return nil, err
	}
	return d.record()
}

// recordDest holds the columns of a scanned row (recordColumns) in one
// allocation, until record turns them into its Record.
type recordDest struct {
	rec     Record
	state   string
	status  *int32
	headers []byte
	body    []byte
	lastErr *string
}

func (d *recordDest) dest() []any {
	r := &d.rec
	return []any{&r.Key.Scope, &r.Key.ID, &d.state, &r.Key.Fingerprint, &r.Attempts, &r.Token,
		&r.LockedUntil, &d.status, &d.headers, &d.body, &d.lastErr, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &r.ReadAt}
}

// record returns the scanned row's Record.
func (d *recordDest) record() (*Record, error) {
	r := &d.rec
	r.State = State(d.state)
	if d.lastErr != nil {
		r.LastError = *d.lastErr
	}
	if d.status != nil || d.body != nil || d.headers != nil {
		res := &Result{Body: d.body}
		if d.status != nil {
			res.Status = int(*d.status)
		}
		if d.headers != nil {
			if err := json.Unmarshal(d.headers, &res.Headers); err != nil {
				return nil, fmt.Errorf("dedupe: decode stored headers: %w", bare(err))
			}
		}
		r.Result = res
	}
	return r, nil
}

// Lookup returns the stored row of key, or ErrNotFound.
func (i *Inbox) Lookup(ctx context.Context, key Key) (*Record, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	return i.lookup(ctx, i.db, key)
}

func (i *Inbox) lookup(ctx context.Context, q Querier, key Key) (*Record, error) {
	rec, err := scanRecord(q.QueryRow(ctx, i.q.lookup, i.cfg.now(), key.Scope, key.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return rec, translate(err)
}
