package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/examples/counter"
	"github.com/exactlyonce/dedupe/examples/shipping"
)

// ship is the business logic: one shipment per order (shipping.Table),
// written in the transaction that holds the message's claim. A body that
// is no order is a permanent error: the inbox records its key failed at
// once, without retrying it.
func ship(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
	o, err := shipping.Decode(d.Body)
	if err != nil {
		return err
	}
	return shipping.Insert(ctx, tx, o)
}

// declareQueue declares the queue durable, with dead-letter exchange
// <queue>.dlx (fanout) routing to queue <queue>.dlq, unless the queue
// exists: then it is used as it is (declaring it again with other arguments
// would fail).
func declareQueue(url, queue string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ at %s: %w (start it, or set AMQP_URL)", redact(url), err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err == nil {
		return nil
	} else if ae := (*amqp.Error)(nil); !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		return fmt.Errorf("queue %s: %w", queue, err)
	}
	// The passive declare's 404 closed that channel.
	if ch, err = conn.Channel(); err != nil {
		return err
	}
	dlx, dlq := queue+".dlx", queue+".dlq"
	if err := ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("exchange %s: %w", dlx, err)
	}
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		return fmt.Errorf("queue %s: %w", dlq, err)
	}
	if err := ch.QueueBind(dlq, "", dlx, false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", dlq, err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx}); err != nil {
		return fmt.Errorf("queue %s: %w", queue, err)
	}
	return nil
}

// redact hides the password of an AMQP URL.
func redact(url string) string {
	if u, err := amqp.ParseURI(url); err == nil {
		u.Password = "xxx"
		return u.String()
	}
	return "the AMQP_URL"
}

// run consumes until ctx is cancelled.
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
	// The same table as nats-consumer's, so that they can share a database.
	if err := shipping.CreateTable(ctx, pool, shipping.Table); err != nil {
		return fmt.Errorf("create shipments: %w", err)
	}
	// The inbox's Observer is told of every message and of what the runner
	// did with it; this one counts, for the closing log line (dedupeotel's
	// makes OpenTelemetry spans and metrics of the same).
	counts := counter.New()
	inbox, err := dedupe.New(pool, dedupe.Config{Logger: log, Observer: counts})
	if err != nil {
		return err
	}
	if err := declareQueue(cfg.AMQPURL, cfg.Queue); err != nil {
		return err
	}
	rcfg := dedupeamqp.Config{Workers: cfg.Workers, Logger: log}
	if cfg.KeyHeader != "" {
		rcfg.Key = dedupeamqp.HeaderKey(cfg.KeyHeader)
	}
	r, err := dedupeamqp.New(inbox, cfg.AMQPURL, cfg.Queue, rcfg, ship)
	if err != nil {
		return err
	}

	// Keys outlive the longest redelivery; purge expired ones now and then.
	purgeCtx, stopPurge := context.WithCancel(ctx)
	purged := make(chan struct{})
	go func() {
		defer close(purged)
		_ = inbox.RunPurger(purgeCtx, cfg.PurgeEvery)
	}()
	defer func() {
		stopPurge()
		<-purged
	}()

	log.Info("consuming", "queue", cfg.Queue, "scope", r.Scope(), "workers", cfg.Workers)
	if cfg.ready != nil {
		cfg.ready()
	}
	err = r.Run(ctx)
	log.Info("stopped", "processed", counts.Handled(dedupe.OutcomeClaimed), "duplicates", counts.Handled(dedupe.OutcomeDuplicate),
		"retries", counts.Events(dedupe.EventRetried), "dead_lettered", counts.Events(dedupe.EventTerminated))
	return err
}
