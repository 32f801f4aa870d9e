package dedupe

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/txopts"
)

// SQL wraps a database/sql handle to PostgreSQL (over pgx's stdlib, lib/pq or
// any driver that speaks PostgreSQL's SQL) as the DB of an Inbox or Outbox,
// for applications built on database/sql (GORM, Bun, sqlx, sqlc): handlers
// then receive a *sql.Tx (see TxHandlerFunc), and the guarantees are the
// same as with pgx.
//
// What database/sql cannot do costs round trips, never correctness. BEGIN
// goes alone. Over pgx's stdlib the claim and the savepoint follow in one
// round trip, through the *pgx.Conn under the transaction; over other
// drivers (lib/pq, or pgx's stdlib wrapped by another driver) one after the
// other, each only when needed. Over pgx's stdlib the read of an existing key
// is placed as over pgx: with the claim while the inbox's recent claims met
// duplicates, else only after a claim that found its key taken; over other
// drivers it follows only such a claim. The Relay cannot LISTEN, so it polls
// (RelayConfig.PollInterval). A handler's *sql.Tx cannot be guarded, but
// its COMMIT proves that it still holds the claim: a handler that commits
// or rolls back itself (and perhaps begins again) gets ErrTxEnded from
// Handle, nothing is reported processed, and its effects commit at most
// once (Handle says how). Over pgx's stdlib the proof costs no round trip;
// over other drivers one.
func SQL(db *sql.DB) *SQLDB { return &SQLDB{sqlQuerier: sqlQuerier{db}, db: db} }

// SQLTx wraps a database/sql transaction for the calls that join the
// caller's transaction: Inbox.Claim, ClaimBatch, StoreResultTx, CompleteTx
// and Outbox.Enqueue.
func SQLTx(tx *sql.Tx) Querier { return sqlQuerier{tx} }

// SQLDB is a database/sql handle as a DB: the database/sql driver. Build it
// with SQL.
type SQLDB struct {
	sqlQuerier
	db *sql.DB
	// notPgx is set once a connection of db showed not to be pgx's
	// stdlib's: statements behind BEGIN then go one by one, on any
	// connection.
	notPgx atomic.Bool
	// noDirect is set once a pgx stdlib connection of db refused the
	// direct claim round (its configuration wants pgx's batch): claims go
	// through begin from then on (sqldirect.go).
	noDirect atomic.Bool
}

// DB returns the wrapped handle, for packages built on the inbox that run
// transactions of their own (httpidem).
func (d *SQLDB) DB() *sql.DB { return d.db }

var sqlTxType = reflect.TypeFor[*sql.Tx]()

func (d *SQLDB) txType() reflect.Type      { return sqlTxType }
func (d *SQLDB) pipelines() bool           { return false }
func (d *SQLDB) listenPool() *pgxpool.Pool { return nil }

func (d *SQLDB) newBatch(pgx.TxOptions) *pgx.Batch { return &pgx.Batch{} }

// begin begins a transaction and runs b's statements in it. Until db's
// driver showed not to be pgx's stdlib, the transaction runs on a connection
// of its own, so that b can go through the *pgx.Conn under it in one round
// trip (sendPipelined); otherwise b's statements go one by one.
func (d *SQLDB) begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (txConn, error) {
	pipelined := b != nil && len(b.QueuedQueries) > 0 && !d.notPgx.Load()
	t, err := d.beginTx(ctx, txopts.SQL(opts), pipelined)
	if err != nil {
		return nil, err
	}
	// A panic in a statement's callback (the core's, or a pgx tracer's)
	// goes on to the caller, who has no transaction to roll back yet.
	defer func() {
		if v := recover(); v != nil {
			_ = t.Rollback(context.WithoutCancel(ctx))
			panic(v)
		}
	}()
	if err := t.setDeferrable(ctx, opts); err != nil {
		return nil, err
	}
	if b == nil {
		return t, nil
	}
	err = errNotPgx
	if pipelined {
		err = d.sendPipelined(ctx, t, b)
	}
	if errors.Is(err, errNotPgx) {
		err = sendBatch(ctx, t, b)
	}
	if err != nil {
		_ = t.Rollback(ctx)
		return nil, err
	}
	return t, nil
}

// badConnTries is how often beginTx takes a connection of its own when BEGIN
// finds it broken (driver.ErrBadConn), as (*sql.DB).BeginTx does: a
// *sql.Conn's BeginTx does not try another connection by itself.
const badConnTries = 3

// beginTx begins a transaction of db's, on a connection of its own (kept in
// the sqlTx until the transaction ends) when onConn.
func (d *SQLDB) beginTx(ctx context.Context, so *sql.TxOptions, onConn bool) (*sqlTx, error) {
	if !onConn {
		tx, err := d.db.BeginTx(ctx, so)
		if err != nil {
			return nil, err
		}
		return &sqlTx{sqlQuerier: sqlQuerier{tx}, tx: tx}, nil
	}
	for try := 1; ; try++ {
		conn, err := d.db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		tx, err := conn.BeginTx(ctx, so)
		if err == nil {
			return &sqlTx{sqlQuerier: sqlQuerier{tx}, tx: tx, conn: conn}, nil
		}
		_ = conn.Close() // database/sql discards a bad connection itself
		if !errors.Is(err, sqldriver.ErrBadConn) || try == badConnTries {
			return nil, err
		}
	}
}

// pgxConner is a database/sql driver connection of pgx's stdlib, which
// hands out the *pgx.Conn under it.
type pgxConner interface{ Conn() *pgx.Conn }

// errNotPgx is a driver connection that is not a pgxConner.
var errNotPgx = errors.New("dedupe: not a pgx stdlib connection")

// sendPipelined sends b's statements in one round trip through the *pgx.Conn
// under t's connection, as the pgx driver does behind BEGIN; the handler's
// *sql.Tx then goes on on that connection. errNotPgx, remembered in d, when
// the driver is not pgx's stdlib.
func (d *SQLDB) sendPipelined(ctx context.Context, t *sqlTx, b *pgx.Batch) error {
	return d.rawPgx(t, func(conn *pgx.Conn) error { return conn.SendBatch(ctx, b).Close() })
}

// rawPgx runs f with the *pgx.Conn under t's connection: errNotPgx,
// remembered in d, when the driver is not pgx's stdlib.
//
// (*sql.Conn).Raw closes its connection when its function panics or returns
// driver.ErrBadConn, which waits for t to end: a hang. So the function does
// neither; a panic is carried out of Raw and raised again after it.
func (d *SQLDB) rawPgx(t *sqlTx, f func(conn *pgx.Conn) error) error {
	var panicked any
	err := t.conn.Raw(func(dc any) (err error) {
		pc, ok := dc.(pgxConner)
		if !ok {
			d.notPgx.Store(true)
			return errNotPgx
		}
		defer func() {
			if v := recover(); v != nil {
				panicked, err = v, errors.New("dedupe: panic behind BEGIN")
			}
			if errors.Is(err, sqldriver.ErrBadConn) {
				err = fmt.Errorf("dedupe: %v", err) // not %w: see above
			}
		}()
		return f(pc.Conn())
	})
	if panicked != nil {
		panic(panicked)
	}
	return err
}

// sqlTx is a database/sql transaction; its handler receives the *sql.Tx.
type sqlTx struct {
	sqlQuerier
	tx   *sql.Tx
	conn *sql.Conn // the connection tx holds, when begun on one of its own (beginTx)
}

// setDeferrable makes t DEFERRABLE if opts say so (database/sql has no
// option for it); on error t is rolled back.
func (t *sqlTx) setDeferrable(ctx context.Context, opts pgx.TxOptions) error {
	if opts.DeferrableMode != pgx.Deferrable {
		return nil
	}
	if _, err := t.Exec(ctx, "SET TRANSACTION DEFERRABLE"); err != nil {
		_ = t.Rollback(ctx)
		return err
	}
	return nil
}

func (t *sqlTx) Commit(context.Context) error { return t.release(t.tx.Commit()) }

func (t *sqlTx) Rollback(context.Context) error { return t.release(t.tx.Rollback()) }

// release returns the connection t was begun on to the pool, once t ended
// (a *sql.Conn cannot close while its transaction is open).
func (t *sqlTx) release(err error) error {
	if t.conn != nil {
		_ = t.conn.Close()
	}
	return err
}
func (t *sqlTx) handlerTx() any { return t.tx }

// status cannot be read without a round trip: an ended or failed
// transaction shows when the next statement or the COMMIT is refused.
func (t *sqlTx) status() byte { return 'T' }

// ended cannot be known in advance either: the next statement is refused
// with sql.ErrTxDone (isTxDone), and the caller then acts as if it knew.
func (t *sqlTx) ended() bool { return false }

// sqlRunner is what *sql.DB, *sql.Conn and *sql.Tx share.
type sqlRunner interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// sqlQuerier runs the core's statements through database/sql: arguments
// pgx would encode itself (durations, arrays) are sent as PostgreSQL text,
// and intervals are read back from text.
type sqlQuerier struct{ r sqlRunner }

// Exec runs a statement, with dedupe's argument conversions.
func (q sqlQuerier) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := q.r.ExecContext(ctx, query, sqlArgs(args)...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag("EXEC " + strconv.FormatInt(n, 10)), nil
}

// Query runs a query; its rows read intervals as durations.
func (q sqlQuerier) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	rows, err := q.r.QueryContext(ctx, query, sqlArgs(args)...)
	if err != nil {
		return nil, err
	}
	return &sqlRows{rows: rows}, nil
}

// QueryRow runs a query for one row; no row is pgx.ErrNoRows (and
// sql.ErrNoRows).
func (q sqlQuerier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return sqlRow{q.r.QueryRowContext(ctx, query, sqlArgs(args)...)}
}

// errSQLNoRows is sql.ErrNoRows that is also pgx.ErrNoRows.
var errSQLNoRows = fmt.Errorf("%w (%w)", pgx.ErrNoRows, sql.ErrNoRows)

type sqlRow struct{ row *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := r.row.Scan(sqlDest(dest)...)
	if errors.Is(err, sql.ErrNoRows) {
		return errSQLNoRows
	}
	return err
}

// sqlRows are *sql.Rows as pgx.Rows, for the core's loops over rows.
type sqlRows struct {
	rows *sql.Rows
	err  error
}

func (r *sqlRows) Close()                                       { _ = r.rows.Close() }
func (r *sqlRows) Err() error                                   { return errors.Join(r.err, r.rows.Err()) }
func (r *sqlRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *sqlRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *sqlRows) Next() bool                                   { return r.err == nil && r.rows.Next() }
func (r *sqlRows) RawValues() [][]byte                          { return nil }
func (r *sqlRows) Conn() *pgx.Conn                              { return nil }
func (r *sqlRows) TypeMap() *pgtype.Map                         { return sqlTypeMap }

// sqlTypeMap is the pgtype.Map sqlRows report; nothing of the core uses it.
var sqlTypeMap = pgtype.NewMap()

func (r *sqlRows) Scan(dest ...any) error {
	if err := r.rows.Scan(sqlDest(dest)...); err != nil {
		r.err = err
		return err
	}
	return nil
}

func (r *sqlRows) Values() ([]any, error) {
	cols, err := r.rows.Columns()
	if err != nil {
		return nil, err
	}
	vals := make([]any, len(cols))
	dest := make([]any, len(cols))
	for n := range vals {
		dest[n] = &vals[n]
	}
	return vals, r.rows.Scan(dest...)
}

// sqlArgs converts the arguments database/sql drivers do not all take:
// durations become intervals, slices arrays, both as PostgreSQL text.
func sqlArgs(args []any) []any {
	var out []any
	for n, a := range args {
		var c any
		switch v := a.(type) {
		case time.Duration:
			c = strconv.FormatInt(v.Microseconds(), 10) + " microseconds"
		case []string:
			c = arrayText(len(v), func(b *strings.Builder, j int) { quoteElem(b, v[j]) })
		case []int64:
			c = arrayText(len(v), func(b *strings.Builder, j int) { b.WriteString(strconv.FormatInt(v[j], 10)) })
		case [][]byte:
			c = arrayText(len(v), func(b *strings.Builder, j int) {
				if v[j] == nil {
					b.WriteString("NULL")
					return
				}
				fmt.Fprintf(b, `"\\x%x"`, v[j])
			})
		default:
			if out != nil {
				out[n] = a
			}
			continue
		}
		if out == nil {
			out = append(make([]any, 0, len(args)), args...)
		}
		out[n] = c
	}
	if out == nil {
		return args
	}
	return out
}

// arrayText writes an array literal of n elements.
func arrayText(n int, elem func(b *strings.Builder, j int)) string {
	var b strings.Builder
	b.WriteByte('{')
	for j := range n {
		if j > 0 {
			b.WriteByte(',')
		}
		elem(&b, j)
	}
	b.WriteByte('}')
	return b.String()
}

// quoteElem writes s as a double-quoted array element.
func quoteElem(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		if r == '"' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
}

// sqlDest replaces the destinations database/sql cannot fill from
// PostgreSQL's text (intervals into durations).
func sqlDest(dest []any) []any {
	var out []any
	for n, d := range dest {
		var c any
		switch p := d.(type) {
		case *time.Duration:
			c = &intervalDest{d: p}
		case **time.Duration:
			c = &intervalDest{pd: p}
		default:
			continue
		}
		if out == nil {
			out = append(make([]any, 0, len(dest)), dest...)
		}
		out[n] = c
	}
	if out == nil {
		return dest
	}
	return out
}

// intervalDest scans an interval in PostgreSQL's text form into a
// time.Duration (d) or a *time.Duration that is nil for NULL (pd).
type intervalDest struct {
	d  *time.Duration
	pd **time.Duration
}

func (i *intervalDest) Scan(src any) error {
	var s string
	switch v := src.(type) {
	case nil:
		if i.pd == nil {
			return errors.New("dedupe: NULL interval")
		}
		*i.pd = nil
		return nil
	case string:
		s = v
	case []byte:
		s = string(v)
	case time.Duration:
		return i.set(v)
	case int64:
		return i.set(time.Duration(v) * time.Microsecond)
	default:
		return fmt.Errorf("dedupe: cannot read an interval from %T", src)
	}
	d, err := parseInterval(s)
	if err != nil {
		return err
	}
	return i.set(d)
}

func (i *intervalDest) set(d time.Duration) error {
	if i.pd != nil {
		*i.pd = &d
	} else {
		*i.d = d
	}
	return nil
}

// parseInterval parses PostgreSQL's default interval output ("1 year 2 mons
// 3 days 04:05:06.789", each part optional, parts signed), with a month as
// 30 days and a year as 12 months, as PostgreSQL's own arithmetic counts.
func parseInterval(s string) (time.Duration, error) {
	var d time.Duration
	f := strings.Fields(s)
	for n := 0; n < len(f); n++ {
		if strings.Contains(f[n], ":") {
			t, err := parseClock(f[n])
			if err != nil {
				return 0, fmt.Errorf("dedupe: interval %q: %w", s, bare(err))
			}
			d += t
			continue
		}
		if n+1 >= len(f) {
			return 0, fmt.Errorf("dedupe: interval %q: unit missing", s)
		}
		v, err := strconv.ParseInt(f[n], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("dedupe: interval %q: %w", s, bare(err))
		}
		n++
		day := time.Duration(v) * 24 * time.Hour
		switch strings.TrimSuffix(f[n], "s") {
		case "year":
			d += 360 * day
		case "mon":
			d += 30 * day
		case "day":
			d += day
		default:
			return 0, fmt.Errorf("dedupe: interval %q: unit %q", s, f[n])
		}
	}
	return d, nil
}

// parseClock parses [-]HH:MM:SS[.ffffff].
func parseClock(s string) (time.Duration, error) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimLeft(s, "+-")
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return 0, fmt.Errorf("time %q", s)
	}
	h, err1 := strconv.ParseInt(parts[0], 10, 64)
	m, err2 := strconv.ParseInt(parts[1], 10, 64)
	sec, err3 := strconv.ParseFloat(parts[2], 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, err
	}
	d := time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec*float64(time.Second)+0.5)
	if neg {
		d = -d
	}
	return d, nil
}

// commitClaim commits a Consumer's transaction only if it still holds the
// claim (sqlCommitClaim): a handler's *sql.Tx cannot be guarded, so a
// transaction it ended itself (and perhaps began again) shows here, before
// anything is reported processed.
//
// Over pgx's stdlib the check and COMMIT go in one simple query on the
// *pgx.Conn under the transaction, as COMMIT alone would: no round trip
// more. database/sql must still end its *sql.Tx, whose COMMIT pgx would
// send again; the connection is held busy (an empty pgconn pipeline) while
// it does, so that pgx refuses that COMMIT without sending it, and the
// transaction it refers to is already over. Over other drivers (lib/pq)
// the check goes first, on its own, then the driver's COMMIT: one round
// trip more (a lib/pq connection on which COMMIT was sent as a statement is
// marked bad by its own Commit).
func (t *sqlTx) commitClaim(ctx context.Context) error {
	if t.conn != nil {
		done, err := t.commitRaw(ctx)
		if done {
			return err
		}
	}
	if _, err := t.Exec(ctx, sqlCheckClaim); err != nil {
		if code, ok := sqlState(err); ok && code == pgInFailedTx {
			// A statement of the handler failed: the driver's COMMIT says
			// so as it always did (a failed-transaction commit).
			return t.Commit(ctx)
		}
		_ = t.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return t.Commit(ctx)
}

// commitRaw is commitClaim over pgx's stdlib. done is false, with nothing
// sent, when the connection is not pgx's stdlib's or its transaction failed
// (the driver's COMMIT then reports the failed transaction as before).
func (t *sqlTx) commitRaw(ctx context.Context) (done bool, err error) {
	var (
		status byte
		busy   *pgconn.Pipeline
		cerr   error
	)
	rerr := t.conn.Raw(func(dc any) error {
		pc, ok := dc.(pgxConner)
		if !ok {
			return errNotPgx
		}
		c := pc.Conn().PgConn()
		if status = c.TxStatus(); status != 'T' {
			return nil
		}
		// Not cancelled with ctx, as database/sql's own COMMIT is not: an
		// interrupted COMMIT is one more outcome to resolve.
		mrr := c.Exec(context.WithoutCancel(ctx), sqlCommitClaim)
		for mrr.NextResult() {
			_, _ = mrr.ResultReader().Close()
		}
		if cerr = mrr.Close(); cerr == nil && c.TxStatus() == 'I' {
			busy = c.StartPipeline(context.Background())
		}
		return nil
	})
	switch {
	case errors.Is(rerr, errNotPgx):
		return false, nil
	case rerr != nil:
		return true, rerr
	case status == 'E':
		return false, nil
	case status != 'T':
		_ = t.Rollback(context.WithoutCancel(ctx))
		return true, errTxIdle
	}
	if busy == nil {
		// The check or the COMMIT failed: nothing committed, or the
		// connection broke and the outcome is the caller's to resolve.
		_ = t.Rollback(context.WithoutCancel(ctx))
		return true, cerr
	}
	_ = t.tx.Commit() // refused by pgx without a round trip: the connection is busy
	_ = t.conn.Raw(func(any) error {
		_ = busy.Close()
		return nil
	})
	_ = t.conn.Close()
	return true, nil
}
