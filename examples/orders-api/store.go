package main

// All SQL of orders-api.

// sqlCreateOrders creates the orders table. version backs the ETag.
const sqlCreateOrders = `CREATE TABLE IF NOT EXISTS orders (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id   text        NOT NULL,
    cart_id     text        NOT NULL,
    total_cents bigint      NOT NULL CHECK (total_cents >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    version     bigint      NOT NULL DEFAULT 1
)`

// sqlCreateOrdersIndex serves the tenant-scoped lookups.
const sqlCreateOrdersIndex = `CREATE INDEX IF NOT EXISTS orders_tenant_id_idx ON orders (tenant_id, id)`

// sqlInsertOrder: $1 tenant, $2 cart, $3 total.
const sqlInsertOrder = `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ($1, $2, $3)
RETURNING id::text, tenant_id, cart_id, total_cents, created_at, version`

// sqlGetOrder: $1 tenant, $2 id.
const sqlGetOrder = `SELECT id::text, tenant_id, cart_id, total_cents, created_at, version FROM orders
WHERE tenant_id = $1 AND id = $2::uuid`

// setOrder is the SET list of PUT /orders/{id} for httpidem.Versioned:
// $1 cart, $2 total.
const setOrder = `cart_id = $1, total_cents = $2`
