package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/examples/counter"
	"github.com/exactlyonce/dedupe/examples/embeddedkafka"
)

// embeddedPartitions is the number of partitions of the topics of the
// embedded broker.
const embeddedPartitions = 3

// payment is the event body.
type payment struct {
	PaymentID   string `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
}

const createLedger = `CREATE TABLE IF NOT EXISTS ledger (
    id           bigserial PRIMARY KEY,
    payment_id   text   NOT NULL,
    account      text   NOT NULL,
    amount_cents bigint NOT NULL,
    booked_at    timestamptz NOT NULL DEFAULT now())`

const insertLedger = `INSERT INTO ledger (payment_id, account, amount_cents)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`

// book is the business logic: one ledger entry per new payment of the batch,
// all in one statement, in the transaction that holds their claims. A
// malformed event fails the batch with a permanent error; the adapter then
// handles the batch one event at a time, books the good ones and
// dead-letters the bad one.
func book(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
	ids := make([]string, len(msgs))
	accounts := make([]string, len(msgs))
	amounts := make([]int64, len(msgs))
	for n, m := range msgs {
		var p payment
		if err := json.Unmarshal(m.Value, &p); err != nil {
			return dedupe.Permanent(fmt.Errorf("decode payment at offset %d: %w", m.Offset, err))
		}
		if p.PaymentID == "" || p.Account == "" || p.AmountCents == 0 {
			return dedupe.Permanent(fmt.Errorf("invalid payment at offset %d: %+v", m.Offset, p))
		}
		ids[n], accounts[n], amounts[n] = p.PaymentID, p.Account, p.AmountCents
	}
	_, err := tx.Exec(ctx, insertLedger, ids, accounts, amounts)
	return err
}

// migrateLedger creates the ledger table; copies starting together take
// turns under an advisory lock.
func migrateLedger(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('dedupe-example-ledger'))"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, createLedger)
		return err
	})
}

// run consumes until ctx is cancelled.
func run(ctx context.Context, cfg config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pcfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		return err
	}
	if err := migrateLedger(ctx, pool); err != nil {
		return fmt.Errorf("create ledger: %w", err)
	}
	// Keys must outlive the longest redelivery: a day of retention is plenty
	// for a consumer group that is never more than hours behind.
	// The inbox's Observer is told of every message and of what the runner
	// did beyond it; this one counts, for the progress log lines
	// (dedupeotel's makes OpenTelemetry spans and metrics of the same).
	counts := counter.New()
	inbox, err := dedupe.New(pool, dedupe.Config{Retention: 24 * time.Hour, Logger: log, Observer: counts})
	if err != nil {
		return err
	}

	if cfg.Embedded {
		topics := []string{cfg.Topic}
		if cfg.DLQTopic != "" {
			topics = append(topics, cfg.DLQTopic)
		}
		broker, err := embeddedkafka.Start(cfg.Brokers[0], embeddedPartitions, topics...)
		if err != nil {
			return fmt.Errorf("%w (is a Kafka broker already listening there? then drop -embedded, or set KAFKA_BROKERS to a free address)", err)
		}
		defer broker.Close()
		cfg.Brokers = broker.Addrs()
		log.Info("embedded Kafka-protocol broker started", "brokers", cfg.Brokers, "topics", topics, "partitions", embeddedPartitions)
	}
	partitions, err := checkBrokers(ctx, cfg.Brokers, cfg.Topic)
	if err != nil {
		return err
	}

	rc := kafka.ReaderConfig{
		Brokers:     cfg.Brokers,
		GroupID:     cfg.Group,
		Topic:       cfg.Topic,
		StartOffset: kafka.FirstOffset,
		MaxWait:     500 * time.Millisecond,
		MaxBytes:    4 << 20,
	}
	if cfg.fastGroup {
		rc.MaxWait, rc.HeartbeatInterval, rc.SessionTimeout, rc.RebalanceTimeout, rc.JoinGroupBackoff =
			50*time.Millisecond, 100*time.Millisecond, 1500*time.Millisecond, 1500*time.Millisecond, 100*time.Millisecond
	}
	rcfg := dedupekafka.Config{BatchSize: cfg.BatchSize, Logger: log}
	if cfg.DLQTopic != "" {
		transport := &kafka.Transport{}
		defer transport.CloseIdleConnections()
		dlq := &kafka.Writer{
			Addr:         kafka.TCP(cfg.Brokers...),
			Topic:        cfg.DLQTopic,
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: 5 * time.Millisecond,
			Transport:    transport,
		}
		defer dlq.Close()
		rcfg.DeadLetter = dlq
	}
	runner, err := dedupekafka.NewBatch(inbox, rc, rcfg, book)
	if err != nil {
		return err
	}

	// Expired keys are purged now and then; progress is logged every minute.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var background sync.WaitGroup
	background.Go(func() { _ = inbox.RunPurger(ctx, cfg.PurgeEvery) })
	background.Go(func() {
		report := time.NewTicker(time.Minute)
		defer report.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-report.C:
				log.Info("progress", "counts", counts.String())
			}
		}
	})
	log.Info("kafka-consumer started", "brokers", cfg.Brokers, "topic", cfg.Topic, "partitions", partitions,
		"group", cfg.Group, "batch", cfg.BatchSize, "dead_letter", cfg.DLQTopic)
	err = runner.Run(ctx)
	cancel()
	background.Wait()
	log.Info("kafka-consumer stopped", "booked", counts.Handled(dedupe.OutcomeClaimed), "duplicates", counts.Handled(dedupe.OutcomeDuplicate),
		"dead_lettered", counts.Events(dedupe.EventDeadLettered), "given_up", counts.Events(dedupe.EventTerminated),
		"paused_partitions", counts.Events(dedupe.EventPartitionPaused), "batches", counts.Events(dedupe.EventBatchHandled),
		"fallbacks", counts.Events(dedupe.EventBatchFallback), "offset_commits", counts.Events(dedupe.EventOffsetsCommitted))
	return err
}
