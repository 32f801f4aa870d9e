// Package payments is the application's data layer, written in the shape
// sqlc generates for database/sql (a DBTX interface, New, one method per
// query), so that a handler uses it exactly as an sqlc user would: with the
// *sql.Tx dedupe hands it.
package payments

import (
	"context"
	"database/sql"
)

// DBTX is what the queries run on: a *sql.DB, *sql.Conn or *sql.Tx.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Queries are the application's statements.
type Queries struct{ db DBTX }

// New returns the queries over db.
func New(db DBTX) *Queries { return &Queries{db: db} }

// Schema creates the application's table.
const Schema = `CREATE TABLE IF NOT EXISTS charges (
    id       bigserial PRIMARY KEY,
    order_id text   NOT NULL,
    cents    bigint NOT NULL
)`

// InsertChargeParams are the arguments of InsertCharge.
type InsertChargeParams struct {
	OrderID string
	Cents   int64
}

// InsertCharge records a charge. Note what it lacks: no unique constraint
// on order_id, no "check, then insert". Exactly once comes from dedupe's
// claim in the same transaction.
func (q *Queries) InsertCharge(ctx context.Context, arg InsertChargeParams) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO charges (order_id, cents) VALUES ($1, $2)`, arg.OrderID, arg.Cents)
	return err
}

// CountCharges returns the number of charges and of distinct orders charged.
func (q *Queries) CountCharges(ctx context.Context) (charges, orders int64, err error) {
	err = q.db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT order_id) FROM charges`).Scan(&charges, &orders)
	return charges, orders, err
}
