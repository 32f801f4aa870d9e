package httpidem

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactlyonce/dedupe"
)

// The guard's refusals: each matches the httpidem sentinel and the core's.
var (
	errTxOwned = fmt.Errorf("%w (%w)", ErrTxManaged, dedupe.ErrTxOwned)
	errTxEnded = fmt.Errorf("%w: statement refused (%w)", ErrTxEnded, dedupe.ErrTxEnded)
)

// guardedTx is the request transaction as the handler sees it through Tx:
// its end belongs to the middleware. Commit and Rollback are refused, and
// once the transaction was ended behind the middleware's back (a COMMIT or
// ROLLBACK sent as a statement, or through Conn()) every further statement
// is refused instead of running outside any transaction, where it would
// commit on its own, whatever the request's answer. Begin opens a savepoint,
// which the handler may commit or roll back.
//
// Every check reads the connection's transaction status, which pgx tracks
// from the server's replies: it costs no round trip.
//
// It is the equivalent of the core's unexported guard (dedupe's guard.go),
// kept here until the core exports one.
type guardedTx struct {
	pgx.Tx
	// over is set when the middleware ends the transaction: the connection
	// may then belong to another request, so its status is not read.
	over atomic.Bool
}

func newGuard(tx pgx.Tx) *guardedTx { return &guardedTx{Tx: tx} }

// Commit refuses: the middleware commits after storing the response.
func (g *guardedTx) Commit(context.Context) error { return errTxOwned }

// Rollback refuses: answer 5xx (or panic) to roll the work back.
func (g *guardedTx) Rollback(context.Context) error { return errTxOwned }

// status is the connection's transaction status: 'T' in a transaction, 'E'
// in a failed one, 'I' outside any.
func (g *guardedTx) status() byte {
	if g.over.Load() {
		return 'I'
	}
	conn := g.Tx.Conn()
	if conn == nil || conn.IsClosed() {
		return 'I'
	}
	return conn.PgConn().TxStatus()
}

// live refuses a statement once the transaction has ended.
func (g *guardedTx) live() error {
	if g.status() == 'I' {
		return errTxEnded
	}
	return nil
}

// end marks the transaction as ended by the middleware and returns the
// transaction itself, for the middleware to commit or roll back.
func (g *guardedTx) end() pgx.Tx {
	g.over.Store(true)
	return g.Tx
}

// Begin opens a savepoint (pgx's pseudo nested transaction), guarded too.
func (g *guardedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := g.live(); err != nil {
		return nil, err
	}
	nested, err := g.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &nestedTx{Tx: nested, root: g}, nil
}

// Exec runs a statement in the request transaction.
func (g *guardedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := g.live(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return g.Tx.Exec(ctx, sql, args...)
}

// Query runs a query in the request transaction.
func (g *guardedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := g.live(); err != nil {
		return errRows{err}, err
	}
	return g.Tx.Query(ctx, sql, args...)
}

// QueryRow runs a one-row query in the request transaction.
func (g *guardedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := g.live(); err != nil {
		return errRows{err}
	}
	return g.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends a batch in the request transaction.
func (g *guardedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := g.live(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return g.Tx.SendBatch(ctx, b)
}

// CopyFrom copies rows in the request transaction.
func (g *guardedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := g.live(); err != nil {
		return 0, err
	}
	return g.Tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the request transaction's connection.
func (g *guardedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := g.live(); err != nil {
		return nil, err
	}
	return g.Tx.Prepare(ctx, name, sql)
}

// nestedTx is a savepoint inside the request transaction: the handler may
// commit (release) or roll it back; statements are guarded like the root's.
type nestedTx struct {
	pgx.Tx
	root *guardedTx
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
		return errRows{err}, err
	}
	return n.Tx.Query(ctx, sql, args...)
}

func (n *nestedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := n.root.live(); err != nil {
		return errRows{err}
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

// errRows is the result of a refused query: no rows, the refusal as error.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }
