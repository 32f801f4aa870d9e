package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/outbox"
)

// publishThroughOutbox places the orders as an orders service would: each
// in a request (traced as "place order" by examples/telemetry) whose transaction enqueues the
// message in the outbox, and a relay publishes the outbox to JetStream
// (the Nats-Msg-Id is the outbox message's id). With an OpenTelemetry
// Observer, each message carries its trace context in its headers, so the
// consumer's processing joins the trace of the order's placement. It
// returns once the relay published everything.
func publishThroughOutbox(ctx context.Context, o Options, pool *pgxpool.Pool, js jetstream.JetStream, msgs []order) error {
	ob, err := outbox.New(pool, outbox.Config{Logger: o.Logger, Observer: o.Observer})
	if err != nil {
		return err
	}
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{Stream: streamName})
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{
		DisableListen: true, PollInterval: 20 * time.Millisecond, Logger: o.Logger,
	})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() {
		stopRelay()
		<-relayDone
	}()

	for _, ord := range msgs {
		if err := placeOrder(ctx, o.Place, pool, ob, ord); err != nil {
			return err
		}
	}

	deadline := time.Now().Add(o.Timeout)
	for {
		s, err := ob.Stats(ctx)
		if err != nil {
			return err
		}
		if s.Pending == 0 && s.Parked == 0 {
			return nil
		}
		if s.Parked > 0 || time.Now().After(deadline) {
			return fmt.Errorf("the relay did not publish the outbox: %d pending, %d parked", s.Pending, s.Parked)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// placeOrder enqueues ord in the outbox in a transaction of its own,
// wrapped by place when it is set.
func placeOrder(ctx context.Context, place func(context.Context, string) (context.Context, func()), pool *pgxpool.Pool, ob *outbox.Outbox, ord order) error {
	if place != nil {
		var done func()
		ctx, done = place(ctx, ord.ID)
		defer done()
	}
	payload, err := json.Marshal(ord)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders.created",
			Headers: map[string][]string{orderIDHdr: {ord.ID}}, Payload: payload})
		return err
	})
}
