package dedupekafka_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
)

// A per-message consumer: each order event is handled in its own
// transaction with its claim; its offset is committed after it, within a
// second (Config.CommitInterval).
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		log.Fatal(err)
	}
	// For metrics and traces, give the inbox an Observer (dedupeotel's):
	// it is told of every message and of what the runner did beyond it.
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		log.Fatal(err)
	}
	group := kafka.ReaderConfig{
		Brokers: []string{"127.0.0.1:9092"},
		GroupID: "billing", // also the inbox scope
		Topic:   "orders",
	}
	runner, err := dedupekafka.New(inbox, group, dedupekafka.Config{},
		func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			// Runs once per Idempotency-Key (or message-id); a message with
			// neither is refused: recorded failed under RefusedKey.
			_, err := tx.Exec(ctx, "INSERT INTO invoices (order_key, body) VALUES ($1, $2)", m.Key, m.Value)
			return err
		})
	if err != nil {
		log.Fatal(err)
	}
	if err := runner.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A batch consumer: up to 200 events of a partition are claimed with one
// statement and booked with one more, in one transaction; poison events go
// to a dead-letter topic.
func ExampleNewBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		log.Fatal(err)
	}
	group := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:9092"}, GroupID: "ledger", Topic: "payments"}
	dlq := &kafka.Writer{Addr: kafka.TCP("127.0.0.1:9092"), Topic: "payments.dlq", RequiredAcks: kafka.RequireAll}
	defer dlq.Close()

	runner, err := dedupekafka.NewBatch(inbox, group, dedupekafka.Config{
		BatchSize:   200,
		Linger:      10 * time.Millisecond,
		MaxAttempts: 5,
		DeadLetter:  dlq,
	}, func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		keys := make([][]byte, len(msgs))
		bodies := make([][]byte, len(msgs))
		for n, m := range msgs { // only the new ones: duplicates are left out
			keys[n], bodies[n] = m.Key, m.Value
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (payment_key, body)
			SELECT * FROM unnest($1::bytea[], $2::bytea[])`, keys, bodies)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := runner.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// The key of a message: the first header of Config.KeyHeaders. Without one
// the message is refused and recorded failed under its RefusedKey, unless
// Config.OffsetKeyFallback keys it by its OffsetKey.
func ExampleKeyFromHeaders() {
	m := kafka.Message{Topic: "orders", Partition: 1, Offset: 42, Time: time.UnixMilli(1700000000000),
		Headers: []kafka.Header{{Key: "message-id", Value: []byte("evt-9")}}}
	fmt.Printf("%q\n", dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...))
	m.Headers = nil
	fmt.Printf("%q\n", dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...))
	fmt.Println(dedupekafka.RefusedKey(m))
	fmt.Println(dedupekafka.OffsetKey(m))
	// Output:
	// "evt-9"
	// ""
	// dedupekafka-refused/orders/1/42/1700000000000
	// orders/1/42
}
