// Command kafka-consumer is a small, realistic Kafka consumer with
// exactly-once effects: it books a ledger entry per payment event in
// PostgreSQL. It runs the dedupe Kafka adapter in batch mode: up to
// BATCH_SIZE events of a partition are claimed in the dedupe inbox with one
// statement, the new ones are booked with one more, one transaction commits
// both, and only then does the partition's offset move (committed to the
// group every second, and when partitions are revoked or it stops).
// Redeliveries (a crash between the two commits, a rebalance) and producer
// retries carrying the same Idempotency-Key header are absorbed. An event
// without that header is refused: recorded failed in the inbox and
// dead-lettered. Run several copies in one group: each payment is still
// booked once.
//
//	kafka-consumer [-embedded]          consume until SIGINT or SIGTERM
//	kafka-consumer -publish '{"payment_id":"pay-1","account":"acct-7","amount_cents":1900}'
//
// With -embedded it starts a Kafka-protocol broker in its own process
// (franz-go's kfake, its log in memory) listening on the first address of
// KAFKA_BROKERS, with the topics created, so that nothing else need be
// installed; without it, it connects to the brokers at KAFKA_BROKERS, and
// exits with an error if none answers. With -publish it produces one
// payment, its payment_id as the Idempotency-Key header, and returns once
// the group committed an offset past it, that is once a consumer booked it
// or found it a duplicate (-timeout bounds the wait, including for the
// broker to appear).
//
// Configuration comes from the environment:
//
//	KAFKA_BROKERS    comma-separated brokers            (default 127.0.0.1:9092)
//	DATABASE_URL     PostgreSQL                         (default postgres://postgres@127.0.0.1:5432/test)
//	KAFKA_TOPIC      topic of payment events            (default payments)
//	KAFKA_GROUP      consumer group, the inbox scope    (default ledger)
//	KAFKA_DLQ_TOPIC  dead-letter topic; empty for none  (default empty)
//	BATCH_SIZE       events per transaction             (default 100)
//	PURGE_EVERY      retention purge interval           (default 1h)
//
// With kcat instead of -publish:
//
//	echo '{"payment_id":"pay-1","account":"acct-7","amount_cents":1900}' |
//	  kcat -P -b 127.0.0.1:9092 -t payments -H Idempotency-Key=pay-1
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
	"strings"
	"syscall"
	"time"
)

// config is the program's configuration.
type config struct {
	Brokers     []string
	DatabaseURL string
	Topic       string
	Group       string
	DLQTopic    string
	BatchSize   int
	PurgeEvery  time.Duration
	Logger      *slog.Logger
	// Embedded starts a Kafka-protocol broker in-process on the first of
	// Brokers.
	Embedded bool
	// fastGroup shortens the group timeouts (tests on a loopback broker).
	fastGroup bool
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
		Brokers:     strings.Split(or("KAFKA_BROKERS", "127.0.0.1:9092"), ","),
		DatabaseURL: or("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		Topic:       or("KAFKA_TOPIC", "payments"),
		Group:       or("KAFKA_GROUP", "ledger"),
		DLQTopic:    getenv("KAFKA_DLQ_TOPIC"),
	}
	var err error
	if c.BatchSize, err = strconv.Atoi(or("BATCH_SIZE", "100")); err != nil || c.BatchSize < 1 {
		return c, fmt.Errorf("BATCH_SIZE=%q: want a positive integer", getenv("BATCH_SIZE"))
	}
	if c.PurgeEvery, err = time.ParseDuration(or("PURGE_EVERY", "1h")); err != nil || c.PurgeEvery <= 0 {
		return c, fmt.Errorf("PURGE_EVERY=%q: want a positive duration such as 1h", getenv("PURGE_EVERY"))
	}
	if c.DLQTopic == c.Topic {
		return c, fmt.Errorf("KAFKA_DLQ_TOPIC must differ from KAFKA_TOPIC")
	}
	return c, nil
}

func main() {
	embedded := flag.Bool("embedded", false, "start a Kafka-protocol broker (kfake) in this process, listening on the first address of KAFKA_BROKERS")
	publish := flag.String("publish", "", "produce this payment (JSON) and wait until the group committed past it, instead of consuming")
	timeout := flag.Duration("timeout", 30*time.Second, "with -publish: how long to wait for the broker and the group's commit")
	flag.Parse()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := configFromEnv(os.Getenv)
	if err == nil && flag.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", flag.Arg(0))
	}
	if err == nil && *embedded && *publish != "" {
		err = errors.New("-embedded and -publish exclude each other: the consumer runs the broker, -publish sends to it")
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
		if err := publishPayment(ctx, cfg, []byte(*publish), *timeout, os.Stdout); err != nil {
			logger.Error("publish", "err", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, cfg); err != nil {
		logger.Error("kafka-consumer stopped", "err", err)
		os.Exit(1)
	}
}
