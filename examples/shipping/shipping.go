package shipping

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// Order is a message's body: {"id":"order-1","item":"book","qty":1}.
type Order struct {
	ID   string `json:"id"`
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

// Decode reads an order from a message's body. A body that is not an order
// (not JSON, no id, a quantity below 1) will never be one: its error is
// dedupe.Permanent, so the inbox records the message failed at once.
func Decode(body []byte) (Order, error) {
	var o Order
	if err := json.Unmarshal(body, &o); err != nil {
		return o, dedupe.Permanent(fmt.Errorf("decode order: %w", err))
	}
	if o.ID == "" || o.Qty < 1 {
		return o, dedupe.Permanent(fmt.Errorf("invalid order %+v", o))
	}
	return o, nil
}

// Table creates the shipments table of nats-consumer and rabbitmq-consumer
// if it is missing. Its columns are their contract: programs outside read
// shipments(order_id, item, qty).
const Table = `CREATE TABLE IF NOT EXISTS shipments (
    id         bigserial PRIMARY KEY,
    order_id   text NOT NULL,
    item       text NOT NULL,
    qty        int  NOT NULL,
    shipped_at timestamptz NOT NULL DEFAULT now())`

// CreateTable runs ddl, a CREATE TABLE IF NOT EXISTS (Table, or a
// consumer's own shipments table). That statement is not safe against a
// concurrent copy doing the same, so the copies, of one example or of
// several, take turns under one advisory lock.
func CreateTable(ctx context.Context, pool *pgxpool.Pool, ddl string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('dedupe-example-shipments'))"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ddl)
		return err
	})
}

const insert = `INSERT INTO shipments (order_id, item, qty) VALUES ($1, $2, $3)`

// Insert writes one shipment of o in tx: the transaction that holds the
// message's claim, so that the shipment commits with it or not at all.
func Insert(ctx context.Context, tx pgx.Tx, o Order) error {
	_, err := tx.Exec(ctx, insert, o.ID, o.Item, o.Qty)
	return err
}
