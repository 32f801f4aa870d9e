package dedupewatermill_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	dedupewatermill "github.com/exactlyonce/dedupe/adapters/watermill"
)

// A Watermill router whose handler records each order's shipment exactly
// once, in the same transaction as the claim of the message's UUID; poison
// goes to Watermill's poison queue once recorded failed.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		log.Fatal(err)
	}
	logger := watermill.NewStdLogger(false, false)
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, logger) // or AMQP, SQS, Kafka...

	mw, err := dedupewatermill.New[pgx.Tx](inbox, dedupewatermill.Config{Scope: "shipping", ReturnPoison: true})
	if err != nil {
		log.Fatal(err)
	}
	poison, err := middleware.PoisonQueueWithFilter(pubsub, "orders-poison", dedupewatermill.IsPoison)
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(poison, mw.Handler)
	router.AddNoPublisherHandler("ship", "orders", pubsub, func(msg *message.Message) error {
		tx, _ := dedupewatermill.Tx[pgx.Tx](msg.Context())
		_, err := tx.Exec(msg.Context(), "INSERT INTO shipments (order_id) VALUES ($1)", msg.UUID)
		return err
	})
	if err := router.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
