package main

// The worker's own tables: a ledger line per logical run and a running
// balance. Incrementing the balance is deliberately not idempotent, so a
// second write would show.
const sqlCreateTables = `
CREATE TABLE IF NOT EXISTS airflow_ledger (
    id           bigserial   PRIMARY KEY,
    dag_id       text        NOT NULL,
    task_id      text        NOT NULL,
    run_id       text        NOT NULL,
    map_index    integer     NOT NULL,
    logical_date text,
    try_number   integer     NOT NULL,
    amount_cents bigint      NOT NULL,
    written_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS airflow_balance (
    account text   PRIMARY KEY,
    cents   bigint NOT NULL
);`

// sqlInsertLedger records the run. $1 dag, $2 task, $3 run, $4 map index,
// $5 logical date, $6 try, $7 amount.
const sqlInsertLedger = `INSERT INTO airflow_ledger
    (dag_id, task_id, run_id, map_index, logical_date, try_number, amount_cents)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6, $7)`

// sqlCredit adds $2 cents to account $1.
const sqlCredit = `INSERT INTO airflow_balance (account, cents) VALUES ($1, $2)
ON CONFLICT (account) DO UPDATE SET cents = airflow_balance.cents + EXCLUDED.cents`

// sqlLockTables serializes the CREATE statements of concurrent tries
// (CREATE TABLE IF NOT EXISTS can still collide on the catalog otherwise).
const sqlLockTables = `SELECT pg_advisory_xact_lock(hashtext('dedupe-airflow-worker-tables'))`
