package dedupe

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// guardedTx is the transaction a handler receives: the claim's own, whose
// end belongs to dedupe. Commit and Rollback are refused with ErrTxOwned
// (the handler returns nil to commit, an error to roll back), and once the
// transaction was ended behind dedupe's back (a COMMIT or ROLLBACK sent as a
// statement, or through Conn()) every further statement is refused with
// ErrTxEnded instead of running outside any transaction. Begin opens a
// savepoint as pgx does; the handler may commit or roll back that.
//
// Every check reads the connection's transaction status, which pgx tracks
// from the server's replies: it costs no round trip.
type guardedTx struct {
	pgx.Tx
}

// newGuard wraps tx, the claim's transaction.
func newGuard(tx pgx.Tx) *guardedTx { return &guardedTx{Tx: tx} }

// Commit refuses: the claim's transaction commits when the handler returns.
func (g *guardedTx) Commit(context.Context) error { return ErrTxOwned }

// Rollback refuses: the handler returns an error to roll back.
func (g *guardedTx) Rollback(context.Context) error { return ErrTxOwned }

// status is the connection's transaction status: 'T' in a transaction, 'E'
// in a failed one, 'I' outside any.
func (g *guardedTx) status() byte {
	conn := g.Tx.Conn()
	if conn == nil {
		return 'I'
	}
	return conn.PgConn().TxStatus()
}

// live refuses a statement once the transaction has ended.
func (g *guardedTx) live() error {
	if g.status() == 'I' {
		return fmt.Errorf("%w: statement refused", ErrTxEnded)
	}
	return nil
}

// check is run after the handler returned nil: the transaction must still
// be open and healthy, or nothing may be reported as processed.
func (g *guardedTx) check() error {
	switch g.status() {
	case 'T':
		return nil
	case 'E':
		return fmt.Errorf("%w: a statement failed and the handler returned nil", ErrTxEnded)
	default:
		return fmt.Errorf("%w: the transaction is no longer open", ErrTxEnded)
	}
}

// ended reports whether the transaction is over (the claim went with it).
func (g *guardedTx) ended() bool { return g.status() == 'I' }

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

// Exec runs a statement in the claim's transaction.
func (g *guardedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := g.live(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return g.Tx.Exec(ctx, sql, args...)
}

// Query runs a query in the claim's transaction.
func (g *guardedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := g.live(); err != nil {
		return errRows{err}, err
	}
	return g.Tx.Query(ctx, sql, args...)
}

// QueryRow runs a one-row query in the claim's transaction.
func (g *guardedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := g.live(); err != nil {
		return errRows{err}
	}
	return g.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends a batch in the claim's transaction.
func (g *guardedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := g.live(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return g.Tx.SendBatch(ctx, b)
}

// CopyFrom copies rows in the claim's transaction.
func (g *guardedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := g.live(); err != nil {
		return 0, err
	}
	return g.Tx.CopyFrom(ctx, table, columns, src)
}

// nestedTx is a savepoint inside the claim's transaction: the handler may
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
