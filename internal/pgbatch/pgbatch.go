// Package pgbatch runs a pgx.Batch on any of the root's Queriers: in one
// round trip on a pgx pool, connection or transaction, and one statement
// after the other on one that cannot pipeline (database/sql), where a
// queued statement's callback may leave its statement unsent (SkipRow).
package pgbatch

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/dedupe/internal/driver"
)

// Querier is dedupe.Querier: what runs a statement.
type Querier = driver.Querier

// Send runs b's statements on q: in one round trip when q is a pgx pool,
// connection or transaction, else one after the other.
func Send(ctx context.Context, q Querier, b *pgx.Batch) error {
	if s, ok := q.(interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}); ok {
		return s.SendBatch(ctx, b).Close()
	}
	for _, qq := range b.QueuedQueries {
		if qq.Fn == nil {
			if _, err := q.Exec(ctx, qq.SQL, qq.Arguments...); err != nil {
				return err
			}
			continue
		}
		if err := qq.Fn(&seqResults{ctx: ctx, q: q, qq: qq}); err != nil {
			return err
		}
	}
	return nil
}

// seqResults are the results of one queued statement run on its own, for a
// QueuedQuery's callback.
type seqResults struct {
	ctx context.Context
	q   Querier
	qq  *pgx.QueuedQuery
}

func (r *seqResults) Exec() (pgconn.CommandTag, error) {
	return r.q.Exec(r.ctx, r.qq.SQL, r.qq.Arguments...)
}
func (r *seqResults) Query() (pgx.Rows, error) { return r.q.Query(r.ctx, r.qq.SQL, r.qq.Arguments...) }
func (r *seqResults) QueryRow() pgx.Row        { return lazyRow{r} }
func (r *seqResults) Close() error             { return nil }
func (r *seqResults) Tx() pgx.Tx               { return nil }

// lazyRow runs its statement when it is scanned, so that a callback may
// skip a statement whose answer it already knows (SkipRow): what a driver
// that sends statements one by one saves, and a pipeline cannot.
type lazyRow struct{ r *seqResults }

func (l lazyRow) Scan(dest ...any) error {
	return l.r.q.QueryRow(l.r.ctx, l.r.qq.SQL, l.r.qq.Arguments...).Scan(dest...)
}

// SkipRow reports whether row's statement may be left unsent: true for a
// statement run one by one (by Send, on a Querier that cannot pipeline),
// false in a pipeline, where it was sent already and must be read.
func SkipRow(row pgx.Row) bool {
	_, ok := row.(lazyRow)
	return ok
}

// sent is the flag of a statement sent in a pipeline: always.
var sent = true

// QueueUnlessSkipped queues sql, a statement that returns no row, on b,
// where pipelined tells that b goes in one round trip. In a pipeline it is
// always sent; run one by one (Send on a Querier that cannot pipeline) it
// is sent only when *needed holds by then (set by a statement queued
// before it). The returned flag tells, once b ran, whether it was sent.
func QueueUnlessSkipped(b *pgx.Batch, pipelined bool, sql string, needed *bool) *bool {
	if pipelined {
		b.Queue(sql)
		return &sent
	}
	done := new(bool)
	b.Queue(sql).QueryRow(func(row pgx.Row) error {
		if !*needed && SkipRow(row) {
			return nil
		}
		*done = true
		if err := row.Scan(); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return nil
	})
	return done
}
