// Package sqldb is the database/sql driver below the root package's seam: its
// transactions (begun on a connection of their own where pgx's stdlib lets
// the core reach the *pgx.Conn under them, committed only while they hold
// their claim: tx.go) and the Querier that runs the core's statements: what a
// Querier over a *sql.DB, *sql.Conn or *sql.Tx needs that database/sql
// drivers do not all do (durations as intervals, slices as arrays, both as
// PostgreSQL text; intervals read back from text; no row as pgx.ErrNoRows).
package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Runner is what *sql.DB, *sql.Conn and *sql.Tx share.
type Runner interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Querier runs the core's statements through database/sql: arguments
// pgx would encode itself (durations, arrays) are sent as PostgreSQL text,
// and intervals are read back from text.
type Querier struct{ R Runner }

// Exec runs a statement, with dedupe's argument conversions.
func (q Querier) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := q.R.ExecContext(ctx, query, Args(args)...)
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
func (q Querier) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	rows, err := q.R.QueryContext(ctx, query, Args(args)...)
	if err != nil {
		return nil, err
	}
	return &Rows{rows: rows}, nil
}

// QueryRow runs a query for one row; no row is pgx.ErrNoRows (and
// sql.ErrNoRows).
func (q Querier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return Row{q.R.QueryRowContext(ctx, query, Args(args)...)}
}

// ErrNoRows is sql.ErrNoRows that is also pgx.ErrNoRows.
var ErrNoRows = fmt.Errorf("%w (%w)", pgx.ErrNoRows, sql.ErrNoRows)

type Row struct{ row *sql.Row }

func (r Row) Scan(dest ...any) error {
	err := r.row.Scan(Dest(dest)...)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNoRows
	}
	return err
}

// Rows are *sql.Rows as pgx.Rows, for the core's loops over rows.
type Rows struct {
	rows *sql.Rows
	err  error
}

func (r *Rows) Close()                                       { _ = r.rows.Close() }
func (r *Rows) Err() error                                   { return errors.Join(r.err, r.rows.Err()) }
func (r *Rows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *Rows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *Rows) Next() bool                                   { return r.err == nil && r.rows.Next() }
func (r *Rows) RawValues() [][]byte                          { return nil }
func (r *Rows) Conn() *pgx.Conn                              { return nil }
func (r *Rows) TypeMap() *pgtype.Map                         { return typeMap }

// typeMap is the pgtype.Map Rows report; nothing of the core uses it.
var typeMap = pgtype.NewMap()

func (r *Rows) Scan(dest ...any) error {
	if err := r.rows.Scan(Dest(dest)...); err != nil {
		r.err = err
		return err
	}
	return nil
}

func (r *Rows) Values() ([]any, error) {
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

// Args converts the arguments database/sql drivers do not all take:
// durations become intervals, slices arrays, both as PostgreSQL text.
func Args(args []any) []any {
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

// Dest replaces the destinations database/sql cannot fill from
// PostgreSQL's text (intervals into durations).
func Dest(dest []any) []any {
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
	d, err := ParseInterval(s)
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

// ParseInterval parses PostgreSQL's default interval output ("1 year 2 mons
// 3 days 04:05:06.789", each part optional, parts signed), with a month as
// 30 days and a year as 12 months, as PostgreSQL's own arithmetic counts.
func ParseInterval(s string) (time.Duration, error) {
	var d time.Duration
	f := strings.Fields(s)
	for n := 0; n < len(f); n++ {
		if strings.Contains(f[n], ":") {
			t, err := parseClock(f[n])
			if err != nil {
				return 0, fmt.Errorf("dedupe: interval %q: %w", s, err)
			}
			d += t
			continue
		}
		if n+1 >= len(f) {
			return 0, fmt.Errorf("dedupe: interval %q: unit missing", s)
		}
		v, err := strconv.ParseInt(f[n], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("dedupe: interval %q: %w", s, err)
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
