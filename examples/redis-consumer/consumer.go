package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
	"github.com/exactlyonce/dedupe/examples/counter"
	"github.com/exactlyonce/dedupe/examples/shipping"
)

// createShipments is this consumer's shipments table, created if missing:
// the columns of the other consumers' (shipping.Table) that programs read,
// without their id and shipped_at.
const createShipments = `CREATE TABLE IF NOT EXISTS shipments (
    order_id text NOT NULL,
    item     text NOT NULL,
    qty      int  NOT NULL)`

// ship is the business logic: one shipment per order, written in the
// transaction that holds the entry's claim.
func ship(ctx context.Context, tx pgx.Tx, m *deduperedis.Message) error {
	id, item := m.Field("id"), m.Field("item")
	qty, err := strconv.Atoi(m.Field("qty"))
	if id == "" || err != nil || qty < 1 {
		return dedupe.Permanent(fmt.Errorf("invalid order: id=%q item=%q qty=%q", id, item, m.Field("qty")))
	}
	return shipping.Insert(ctx, tx, shipping.Order{ID: id, Item: item, Qty: qty})
}

// run consumes until ctx is cancelled, then drains and returns nil.
func run(ctx context.Context, cfg config) error {
	log := cfg.Logger
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pcfg.MaxConns = int32(cfg.Workers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		return err
	}
	if err := shipping.CreateTable(ctx, pool, createShipments); err != nil {
		return fmt.Errorf("create shipments: %w", err)
	}
	// The inbox's Observer is told of every entry and of what the runner
	// did with it; this one counts, for the closing log line (dedupeotel's
	// makes OpenTelemetry spans and metrics of the same).
	counts := counter.New()
	inbox, err := dedupe.New(pool, dedupe.Config{Logger: log, Observer: counts})
	if err != nil {
		return err
	}

	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	opt.ClientName = "dedupe-redis-consumer"
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("connect to Redis at %s: %w (start one, or set REDIS_URL)", opt.Addr, err)
	}

	r, err := deduperedis.New(inbox, rdb, cfg.Stream, cfg.Group, deduperedis.Config{
		Key:              deduperedis.FieldKey(cfg.KeyField),
		Workers:          cfg.Workers,
		ClaimIdle:        cfg.ClaimIdle,
		DeadLetterStream: cfg.Stream + "-dead",
		Logger:           log,
	}, ship)
	if err != nil {
		return err
	}
	if err := r.CreateGroup(ctx); err != nil {
		return err
	}
	log.Info("consuming", "stream", cfg.Stream, "group", cfg.Group, "consumer", r.Config().Consumer,
		"scope", r.Scope(), "workers", cfg.Workers, "claim_idle", cfg.ClaimIdle)
	if cfg.ready != nil {
		cfg.ready()
	}
	err = r.Run(ctx)
	log.Info("stopped", "processed", counts.Handled(dedupe.OutcomeClaimed), "duplicates", counts.Handled(dedupe.OutcomeDuplicate),
		"retries", counts.Events(dedupe.EventRetried), "terminated", counts.Events(dedupe.EventTerminated))
	return err
}
