package deduperedis_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
)

// A shipping service consumes the orders stream through the group
// "shipping": each order's shipment is inserted exactly once, however often
// the order is added or redelivered.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	r, err := deduperedis.New(inbox, rdb, "orders", "shipping", deduperedis.Config{
		Workers:          8,
		DeadLetterStream: "orders-dead",
	}, func(ctx context.Context, tx pgx.Tx, m *deduperedis.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, item) VALUES ($1, $2)",
			m.Field("id"), m.Field("item"))
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Run returns once SIGTERM came and in-flight entries drained.
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
