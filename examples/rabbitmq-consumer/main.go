// Command rabbitmq-consumer is a small, realistic RabbitMQ consumer with
// exactly-once effects: it records a shipment per order message in
// PostgreSQL, claiming each message's key in the dedupe inbox in the same
// transaction, and acks only after the commit. Run several copies side by
// side, redeliver as often as you like: each order still ships once.
//
//	rabbitmq-consumer                    consume until SIGINT or SIGTERM (drains, exits 0)
//	rabbitmq-consumer -publish '{"id":"order-1","item":"book","qty":1}'
//
// With -publish it publishes one order to the queue, with publisher confirms
// and the mandatory flag, the order id as message_id and in the KEY_HEADER
// header, and returns once the broker confirmed it.
//
// Configuration comes from the environment:
//
//	AMQP_URL      RabbitMQ                      (default amqp://guest:guest@127.0.0.1:5672/)
//	DATABASE_URL  PostgreSQL                    (default postgres://postgres@127.0.0.1:5432/test)
//	AMQP_QUEUE    queue, the scope              (default orders); declared durable if missing,
//	              with dead-letter exchange <queue>.dlx routing to queue <queue>.dlq
//	KEY_HEADER    header holding the dedup key  (default Order-Id; "-" for the message_id property)
//	WORKERS       concurrent handlers           (default 4)
//	PURGE_EVERY   retention purge interval      (default 1h)
//
// The key is the business key, the order id in the Order-Id header, so an
// order published twice (a producer retry under a new message_id) still
// ships once. A message whose body is not an order is poison: recorded
// failed in the inbox (dedupe inspect lists it) and dead-lettered to
// <queue>.dlq; a message without the key header is recorded under the
// adapter's RefusedKey and dead-lettered too.
//
// With rabbitmqadmin instead of -publish:
//
//	rabbitmqadmin publish routing_key=orders properties='{"headers":{"Order-Id":"order-1"}}' \
//	    payload='{"id":"order-1","item":"book","qty":1}'
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// defaultKeyHeader is the header holding an order's id, the dedup key.
const defaultKeyHeader = "Order-Id"

// config is the program's configuration.
type config struct {
	AMQPURL, DatabaseURL string
	Queue                string
	KeyHeader            string // "" for the message_id property
	Workers              int
	PurgeEvery           time.Duration
	Logger               *slog.Logger
	ready                func() // tests: called once the runner starts
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
		AMQPURL:     or("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		DatabaseURL: or("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		Queue:       or("AMQP_QUEUE", "orders"),
		KeyHeader:   or("KEY_HEADER", defaultKeyHeader),
	}
	if c.KeyHeader == "-" {
		c.KeyHeader = ""
	}
	var err error
	if c.Workers, err = strconv.Atoi(or("WORKERS", "4")); err != nil || c.Workers < 1 {
		return c, fmt.Errorf("WORKERS=%q: want a positive integer", getenv("WORKERS"))
	}
	if c.PurgeEvery, err = time.ParseDuration(or("PURGE_EVERY", "1h")); err != nil || c.PurgeEvery <= 0 {
		return c, fmt.Errorf("PURGE_EVERY=%q: want a positive duration such as 1h", getenv("PURGE_EVERY"))
	}
	return c, nil
}

func main() {
	publish := flag.String("publish", "", "publish this order (JSON) with publisher confirms, instead of consuming")
	timeout := flag.Duration("timeout", 30*time.Second, "with -publish: how long to wait for the broker and its confirm")
	flag.Parse()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := configFromEnv(os.Getenv)
	if err == nil && flag.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", flag.Arg(0))
	}
	if err != nil {
		logger.Error("config", "err", err)
		os.Exit(2)
	}
	cfg.Logger = logger
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *publish != "" {
		pctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		if err := publishOrder(pctx, cfg, []byte(*publish), os.Stdout); err != nil {
			logger.Error("publish", "err", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, cfg); err != nil {
		logger.Error("rabbitmq-consumer stopped", "err", err)
		os.Exit(1)
	}
}
