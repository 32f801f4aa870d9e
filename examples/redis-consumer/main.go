// Command redis-consumer is a small, realistic Redis Streams consumer with
// exactly-once effects: it records a shipment per order entry in
// PostgreSQL, claiming each entry's key in the dedupe inbox in the same
// transaction, and acknowledges (XACK) only after the commit. Run several
// copies side by side: each order still ships once.
//
//	redis-consumer      consume until SIGINT or SIGTERM, then drain and exit 0
//
// Configuration comes from the environment:
//
//	REDIS_URL     Redis                              (default redis://127.0.0.1:6379/0)
//	DATABASE_URL  PostgreSQL                         (default postgres://postgres@127.0.0.1:5432/test)
//	REDIS_STREAM  stream                             (default orders)
//	REDIS_GROUP   consumer group, the scope; created at id 0 with MKSTREAM if missing
//	                                                 (default shipping)
//	KEY_FIELD     field holding the dedup key        (default id)
//	WORKERS       concurrent handlers                (default 4)
//	CLAIM_IDLE    how long an entry stays pending before another consumer
//	              reclaims it                        (default 30s)
//
// Entries carry the fields id, item and qty; each order becomes one row of
// shipments(order_id text, item text, qty int), created if missing. An
// entry that is not an order (no id, a qty that is not a positive integer)
// is recorded failed in the inbox (dedupe inspect lists it) and copied to
// the stream <REDIS_STREAM>-dead before it is acknowledged.
//
// With redis-cli:
//
//	redis-cli XADD orders '*' id order-1 item book qty 1
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// config is the program's configuration.
type config struct {
	RedisURL, DatabaseURL string
	Stream, Group         string
	KeyField              string
	Workers               int
	ClaimIdle             time.Duration
	Logger                *slog.Logger
	ready                 func() // tests: called once the runner starts
}

// configFromEnv reads config from getenv, with defaults.
func configFromEnv(getenv func(string) string) (config, error) {
	or := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	c := config{
		RedisURL:    or("REDIS_URL", "redis://127.0.0.1:6379/0"),
		DatabaseURL: or("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		Stream:      or("REDIS_STREAM", "orders"),
		Group:       or("REDIS_GROUP", "shipping"),
		KeyField:    or("KEY_FIELD", "id"),
	}
	var err error
	if c.Workers, err = strconv.Atoi(or("WORKERS", "4")); err != nil || c.Workers < 1 {
		return c, fmt.Errorf("WORKERS=%q: want a positive integer", getenv("WORKERS"))
	}
	if c.ClaimIdle, err = time.ParseDuration(or("CLAIM_IDLE", "30s")); err != nil || c.ClaimIdle < time.Millisecond {
		return c, fmt.Errorf("CLAIM_IDLE=%q: want a duration of at least 1ms, such as 30s", getenv("CLAIM_IDLE"))
	}
	return c, nil
}

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := configFromEnv(os.Getenv)
	if err == nil && len(os.Args) > 1 {
		err = fmt.Errorf("unexpected argument %q: the configuration comes from the environment", os.Args[1])
	}
	if err != nil {
		logger.Error("config", "err", err)
		os.Exit(2)
	}
	cfg.Logger = logger
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		logger.Error("redis-consumer stopped", "err", err)
		os.Exit(1)
	}
}
