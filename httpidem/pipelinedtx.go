package httpidem

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/txguard"
)

// lockTimeoutSetting renders d as a lock_timeout value.
func lockTimeoutSetting(d time.Duration) string {
	return fmt.Sprintf("%dms", max(d.Milliseconds(), 1))
}

// pipelinedTx is the pgx.Tx that Inbox.Claim runs on in transactional mode.
// The transaction does not exist when Claim starts: the first batch Claim
// sends (its insert, and the read of an existing key when the inbox met
// duplicates recently) goes to the server inside a batch begun with pgx's
// Batch.BeginTx, between the statements that set the lock timeout and those
// that restore it and take the savepoint. A read Claim sends after that
// batch (of a key the insert found taken) runs as it is: a plain SELECT
// (plainRead) waits on no row lock, so not on a request that holds the key.
// A statement that may wait on a row lock (a takeover of an expired
// lease) runs under the lock timeout again, and settle then restores it and
// takes the savepoint anew, after the claim.
//
// It stands in for a core API that would begin a transaction with a claim
// (see the package's report to the core); it relies only on Claim's
// documented contract, that it runs its statements on the tx it is given.
type pipelinedTx struct {
	db          pgxDB
	opts        pgx.TxOptions
	lockTimeout string

	tx        pgx.Tx        // nil until begun
	conn      *pgxpool.Conn // the pool's connection tx runs on, held until the request ends; nil for another pgxDB
	pipelined bool          // the reset and the savepoint went with Claim's first batch
	relocked  bool          // the lock timeout was set again after that batch
}

// begin sends BEGIN and the lock timeout with b's statements (if b is not
// nil), followed by the reset and the savepoint.
func (p *pipelinedTx) begin(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	nb := &pgx.Batch{}
	nb.BeginTx(p.opts)
	nb.Queue(sqlSetLockTimeout, p.lockTimeout)
	if b != nil {
		nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
		nb.Queue(sqlRestoreLockTimeout)
		nb.Queue(sqlClaimSavepoint)
		p.pipelined = true
	}
	var sender interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	} = p.db
	if pool, ok := p.db.(*pgxpool.Pool); ok {
		// A connection of its own, so that the request's end can send the
		// stored result and COMMIT together (pgxReq.commitStored).
		c, err := pool.Acquire(ctx)
		if err != nil {
			return pgx.FailedBatchResults(nb, err)
		}
		p.conn, sender = c, c
	}
	br := sender.SendBatch(ctx, nb)
	p.tx = br.Tx()
	return br
}

// end rolls back the transaction, if it was begun, and releases its
// connection: a claim that did not leave it open for the request.
func (p *pipelinedTx) end(ctx context.Context) {
	if p.tx != nil {
		_ = p.tx.Rollback(ctx)
	}
	if p.conn != nil {
		p.conn.Release() // closed by the pool unless the transaction ended
		p.conn = nil
	}
}

// next readies the transaction for a statement: it begins it (without
// pipelining) if Claim's first statement was not a batch, and sets the lock
// timeout again before the first statement after the pipelined batch that
// may wait on a row lock (locks).
func (p *pipelinedTx) next(ctx context.Context, locks bool) error {
	if p.tx == nil {
		return p.begin(ctx, nil).Close()
	}
	if p.pipelined && locks && !p.relocked {
		p.relocked = true
		_, err := p.tx.Exec(ctx, sqlSetLockTimeout, p.lockTimeout)
		return err
	}
	return nil
}

// plainRead reports whether sql is a single SELECT without a locking clause
// and without an advisory lock: a statement that waits on no lock. It is
// deliberately narrow (the core's read of a key is such a statement);
// anything else counts as a statement that may lock, which only costs it the
// lock timeout's round trip.
func plainRead(sql string) bool {
	words := strings.Fields(sql)
	if len(words) == 0 || !strings.EqualFold(words[0], "SELECT") || strings.Contains(sql, ";") {
		return false
	}
	for _, w := range words {
		if strings.EqualFold(w, "FOR") || strings.Contains(strings.ToLower(w), "advisory") {
			return false
		}
	}
	return true
}

// settle is called after a successful claim: unless the reset and the
// savepoint went with the claim and no statement that may lock followed it,
// it restores the lock timeout and takes the savepoint now, in one round
// trip.
func (p *pipelinedTx) settle(ctx context.Context) error {
	if p.pipelined && !p.relocked {
		return nil
	}
	sql := sqlRestoreLockTimeout + "; " + sqlClaimSavepoint
	_, err := p.tx.Exec(ctx, sql)
	return err
}

// SendBatch sends b, beginning the transaction with it if it is the first.
func (p *pipelinedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if p.tx == nil {
		return p.begin(ctx, b)
	}
	if err := p.next(ctx, true); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return p.tx.SendBatch(ctx, b)
}

// Exec runs a statement in the transaction.
func (p *pipelinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := p.next(ctx, true); err != nil {
		return pgconn.CommandTag{}, err
	}
	return p.tx.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction.
func (p *pipelinedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := p.next(ctx, !plainRead(sql)); err != nil {
		return txguard.Refused(err), err
	}
	return p.tx.Query(ctx, sql, args...)
}

// QueryRow runs a one-row query in the transaction.
func (p *pipelinedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := p.next(ctx, !plainRead(sql)); err != nil {
		return txguard.Refused(err)
	}
	return p.tx.QueryRow(ctx, sql, args...)
}

// Begin opens a savepoint in the transaction.
func (p *pipelinedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := p.next(ctx, true); err != nil {
		return nil, err
	}
	return p.tx.Begin(ctx)
}

// CopyFrom copies rows in the transaction.
func (p *pipelinedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := p.next(ctx, true); err != nil {
		return 0, err
	}
	return p.tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the transaction's connection.
func (p *pipelinedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := p.next(ctx, true); err != nil {
		return nil, err
	}
	return p.tx.Prepare(ctx, name, sql)
}

// LargeObjects returns the transaction's large objects, once it is begun.
func (p *pipelinedTx) LargeObjects() pgx.LargeObjects {
	if p.tx == nil {
		return pgx.LargeObjects{}
	}
	return p.tx.LargeObjects()
}

// Commit commits the transaction; the middleware does this, never Claim.
func (p *pipelinedTx) Commit(ctx context.Context) error {
	if p.tx == nil {
		return pgx.ErrTxClosed
	}
	return p.tx.Commit(ctx)
}

// Rollback rolls the transaction back.
func (p *pipelinedTx) Rollback(ctx context.Context) error {
	if p.tx == nil {
		return pgx.ErrTxClosed
	}
	return p.tx.Rollback(ctx)
}

// Conn returns the transaction's connection, nil before it is begun.
func (p *pipelinedTx) Conn() *pgx.Conn {
	if p.tx == nil {
		return nil
	}
	return p.tx.Conn()
}
