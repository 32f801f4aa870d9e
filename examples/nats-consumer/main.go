// Command nats-consumer is a small, realistic JetStream consumer with
// exactly-once effects: it records a shipment per order message in
// PostgreSQL, claiming each message's key in the dedupe inbox in the same
// transaction, and acknowledges only after the commit. Run several copies
// side by side: each order still ships once.
//
//	nats-consumer [-embedded]                 consume until SIGINT or SIGTERM
//	nats-consumer -publish '{"id":"order-1","item":"book","qty":1}'
//
// With -embedded it starts a NATS server with JetStream in its own process,
// listening on NATS_URL's address, so that nothing else need be installed;
// without it, it connects to the server at NATS_URL. With -publish it
// publishes one order to the stream (with its id in the Order-Id header) and
// returns once the durable acknowledged it, that is once a consumer
// committed its shipment or found it a duplicate (-timeout bounds the wait,
// including for the server and the stream to appear).
//
// Configuration comes from the environment:
//
//	NATS_URL       NATS server                  (default nats://127.0.0.1:4222)
//	DATABASE_URL   PostgreSQL                   (default postgres://postgres@127.0.0.1:5432/test)
//	NATS_STREAM    stream, created if missing   (default ORDERS)
//	NATS_SUBJECTS  the stream's subjects        (default orders.>)
//	NATS_DURABLE   durable consumer, the scope  (default shipping)
//	KEY_HEADER     header holding the dedup key (default Order-Id; "-" for the
//	               adapter's default: Nats-Msg-Id, else stream:sequence)
//	WORKERS        concurrent handlers          (default 4)
//	PURGE_EVERY    retention purge interval     (default 1h)
//	DEAD_LETTER    dead-letter subject; stream <NATS_STREAM>_DLQ is created for it
//	               (default dlq.<NATS_STREAM>; "-" for none)
//
// The key is the business key, the order id in the Order-Id header, so an
// order published twice (a producer retry under a new Nats-Msg-Id, which
// JetStream's own duplicate window does not catch) still ships once. The
// durable is created with MaxDeliver -1: JetStream never gives up on a
// message, so no delivery spent on a restart or an outage can make one lapse;
// the inbox's attempt limit decides when a failing message is poison. Keys
// recorded as failed are listed by "dedupe inspect"; messages without a
// usable key (or with a key reused for another order) go to the dead-letter
// subject.
//
// With the nats CLI instead of -publish:
//
//	nats pub orders.created '{"id":"order-1","item":"book","qty":1}' -H Order-Id:order-1
package main

import (
	"context"
	"errors"
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
	NATSURL, DatabaseURL      string
	Embedded                  bool // start a NATS server in-process on NATSURL's address
	Stream, Subjects, Durable string
	KeyHeader                 string
	DeadLetter                string // "" for none
	Workers                   int
	PurgeEvery                time.Duration
	Logger                    *slog.Logger
	ready                     func() // tests: called once the runner starts
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
		NATSURL:     or("NATS_URL", "nats://127.0.0.1:4222"),
		DatabaseURL: or("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		Stream:      or("NATS_STREAM", "ORDERS"),
		Subjects:    or("NATS_SUBJECTS", "orders.>"),
		Durable:     or("NATS_DURABLE", "shipping"),
		KeyHeader:   or("KEY_HEADER", defaultKeyHeader),
		DeadLetter:  or("DEAD_LETTER", "dlq."+or("NATS_STREAM", "ORDERS")),
	}
	if c.DeadLetter == "-" {
		c.DeadLetter = ""
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
	embedded := flag.Bool("embedded", false, "start a NATS server with JetStream in this process, listening on NATS_URL's address")
	publish := flag.String("publish", "", "publish this order (JSON) and wait until the durable acknowledged it, instead of consuming")
	timeout := flag.Duration("timeout", 30*time.Second, "with -publish: how long to wait for the server, the stream and the acknowledgement")
	flag.Parse()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := configFromEnv(os.Getenv)
	if err == nil && flag.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", flag.Arg(0))
	}
	if err == nil && *embedded && *publish != "" {
		err = errors.New("-embedded and -publish exclude each other: the consumer runs the server, -publish sends to it")
	}
	if err != nil {
		logger.Error("config", "err", err)
		os.Exit(2)
	}
	cfg.Logger = logger
	cfg.Embedded = *embedded
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *publish != "" {
		if err := publishOrder(ctx, cfg, []byte(*publish), *timeout, os.Stdout); err != nil {
			logger.Error("publish", "err", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, cfg); err != nil {
		logger.Error("nats-consumer stopped", "err", err)
		os.Exit(1)
	}
}
