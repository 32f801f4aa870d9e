// Package txguard wraps a pgx.Tx whose end belongs to the library (the
// core's Consumer, httpidem's middleware), so that the code it is handed to
// cannot end it, and cannot run statements outside it once it was ended
// behind the library's back. It is the one guard both use.
package txguard

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Tx is the guarded transaction. Commit and Rollback are refused with the
// owned error; once the transaction was ended behind the owner's back (a
// COMMIT or ROLLBACK sent as a statement, or through Conn()), or the owner
// ended it (End), every further statement is refused with the ended error
// instead of running outside any transaction, where it would commit on its
// own. Begin opens a savepoint (pgx's pseudo nested transaction), guarded
// too, which the holder may commit or roll back.
//
// Every check reads the connection's transaction status, which pgx tracks
// from the server's replies: it costs no round trip.
type Tx struct {
	pgx.Tx
	owned, ended error
	// over is set when the owner ends the transaction: the connection may
	// then belong to someone else, so its status is not read.
	over atomic.Bool
}

// New guards tx; owned is what Commit and Rollback return, ended what a
// statement after the transaction's end returns.
func New(tx pgx.Tx, owned, ended error) *Tx { return &Tx{Tx: tx, owned: owned, ended: ended} }

// Commit refuses: the owner commits.
func (g *Tx) Commit(context.Context) error { return g.owned }

// Rollback refuses: the owner rolls back.
func (g *Tx) Rollback(context.Context) error { return g.owned }

// Status is the connection's transaction status: 'T' in a transaction, 'E'
// in a failed one, 'I' outside any (or ended by the owner). A closed
// connection keeps its last status: its statements fail on their own, and
// the owner tells a broken connection from an ended transaction.
func (g *Tx) Status() byte {
	if g.over.Load() {
		return 'I'
	}
	conn := g.Tx.Conn()
	if conn == nil {
		return 'I'
	}
	return conn.PgConn().TxStatus()
}

// Ended reports whether the transaction is over.
func (g *Tx) Ended() bool { return g.Status() == 'I' }

// live refuses a statement once the transaction has ended.
func (g *Tx) live() error {
	if g.Ended() {
		return g.ended
	}
	return nil
}

// End marks the transaction as ended by its owner and returns the
// transaction itself, for the owner to commit or roll back.
func (g *Tx) End() pgx.Tx {
	g.over.Store(true)
	return g.Tx
}

// Begin opens a guarded savepoint.
func (g *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := g.live(); err != nil {
		return nil, err
	}
	inner, err := g.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &nestedTx{Tx: inner, root: g}, nil
}

// Exec runs a statement in the transaction.
func (g *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := g.live(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return g.Tx.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction.
func (g *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := g.live(); err != nil {
		return Refused(err), err
	}
	return g.Tx.Query(ctx, sql, args...)
}

// QueryRow runs a one-row query in the transaction.
func (g *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := g.live(); err != nil {
		return Refused(err)
	}
	return g.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends a batch in the transaction.
func (g *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := g.live(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return g.Tx.SendBatch(ctx, b)
}

// CopyFrom copies rows in the transaction.
func (g *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := g.live(); err != nil {
		return 0, err
	}
	return g.Tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the transaction's connection.
func (g *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := g.live(); err != nil {
		return nil, err
	}
	return g.Tx.Prepare(ctx, name, sql)
}

// nestedTx is a savepoint inside the guarded transaction: the holder may
// commit (release) or roll it back; statements are guarded like the root's.
type nestedTx struct {
	pgx.Tx
	root *Tx
}

func (n *nestedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := n.root.live(); err != nil {
		return nil, err
	}
	inner, err := n.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &nestedTx{Tx: inner, root: n.root}, nil
}

func (n *nestedTx) Commit(ctx context.Context) error {
	if err := n.root.live(); err != nil {
		return err
	}
	return n.Tx.Commit(ctx)
}

func (n *nestedTx) Rollback(ctx context.Context) error {
	if err := n.root.live(); err != nil {
		return err
	}
	return n.Tx.Rollback(ctx)
}

func (n *nestedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := n.root.live(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return n.Tx.Exec(ctx, sql, args...)
}

func (n *nestedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := n.root.live(); err != nil {
		return Refused(err), err
	}
	return n.Tx.Query(ctx, sql, args...)
}

func (n *nestedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := n.root.live(); err != nil {
		return Refused(err)
	}
	return n.Tx.QueryRow(ctx, sql, args...)
}

func (n *nestedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := n.root.live(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return n.Tx.SendBatch(ctx, b)
}

func (n *nestedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := n.root.live(); err != nil {
		return 0, err
	}
	return n.Tx.CopyFrom(ctx, table, columns, src)
}

// ErrRows is the result of a refused query: no rows, the refusal as error.
// It serves as pgx.Rows and as pgx.Row.
type ErrRows struct{ err error }

// Refused returns the rows of a query refused with err.
func Refused(err error) ErrRows { return ErrRows{err} }

// Close does nothing.
func (r ErrRows) Close() {}

// Err returns the refusal.
func (r ErrRows) Err() error { return r.err }

// CommandTag is empty.
func (r ErrRows) CommandTag() pgconn.CommandTag { return pgconn.CommandTag{} }

// FieldDescriptions is empty.
func (r ErrRows) FieldDescriptions() []pgconn.FieldDescription { return nil }

// Next reports no row.
func (r ErrRows) Next() bool { return false }

// Scan returns the refusal.
func (r ErrRows) Scan(...any) error { return r.err }

// Values returns the refusal.
func (r ErrRows) Values() ([]any, error) { return nil, r.err }

// RawValues is empty.
func (r ErrRows) RawValues() [][]byte { return nil }

// Conn is nil.
func (r ErrRows) Conn() *pgx.Conn { return nil }

// TypeMap is nil.
func (r ErrRows) TypeMap() *pgtype.Map { return nil }
