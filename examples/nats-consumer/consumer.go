package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/examples/counter"
	"github.com/exactlyonce/dedupe/examples/embedded"
	"github.com/exactlyonce/dedupe/examples/shipping"
)

// ship is the business logic: one shipment per order (shipping.Table),
// written in the transaction that holds the message's claim. A body that
// is no order is a permanent error: the inbox records its key failed at
// once, without retrying it.
func ship(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
	o, err := shipping.Decode(msg.Data())
	if err != nil {
		return err
	}
	return shipping.Insert(ctx, tx, o)
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

	natsURL := cfg.NATSURL
	if cfg.Embedded {
		addr, err := hostPort(cfg.NATSURL)
		if err != nil {
			return err
		}
		srv, err := embedded.NATS(addr)
		if err != nil {
			return fmt.Errorf("%w (is a NATS server already listening there? then drop -embedded, or set NATS_URL to a free address)", err)
		}
		defer srv.Close()
		natsURL = srv.URL()
		log.Info("embedded NATS server with JetStream started", "url", natsURL)
	}
	nc, err := nats.Connect(natsURL, nats.Name("dedupe-nats-consumer"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w (start a server, set NATS_URL, or pass -embedded)", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.Subjects}}); err != nil {
		return fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	if cfg.DeadLetter != "" {
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream + "_DLQ", Subjects: []string{cfg.DeadLetter}}); err != nil {
			return fmt.Errorf("dead-letter stream %s_DLQ: %w", cfg.Stream, err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		Durable:   cfg.Durable,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   30 * time.Second,
		// Never let JetStream give up on a message: the inbox's attempt
		// limit marks poison as failed, where an operator can see it.
		MaxDeliver: -1,
	})
	if err != nil {
		return fmt.Errorf("consumer %s: %w", cfg.Durable, err)
	}

	rcfg := dedupenats.Config{
		Workers:           cfg.Workers,
		Logger:            log,
		DeadLetterSubject: cfg.DeadLetter,
		DeadLetterJS:      js,
	}
	if cfg.KeyHeader != "" {
		rcfg.Key = dedupenats.HeaderKey(cfg.KeyHeader)
	}
	r, err := dedupenats.New(inbox, cons, rcfg, ship)
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

	log.Info("consuming", "stream", cfg.Stream, "durable", cfg.Durable, "scope", r.Scope(), "workers", cfg.Workers)
	if cfg.ready != nil {
		cfg.ready()
	}
	err = r.Run(ctx)
	log.Info("stopped", "processed", counts.Handled(dedupe.OutcomeClaimed), "duplicates", counts.Handled(dedupe.OutcomeDuplicate),
		"retries", counts.Events(dedupe.EventRetried), "terminated", counts.Events(dedupe.EventTerminated))
	return err
}
