package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/outbox"
)

// publishThroughOutbox places the orders as an orders service would: each
// in a traced request ("place order") whose transaction enqueues the
// message in the outbox, and a relay publishes the outbox to JetStream
// (the Nats-Msg-Id is the outbox message's id). With an OpenTelemetry
// Observer, each message carries its trace context in its headers, so the
// consumer's processing joins the trace of the order's placement. It
// returns once the relay published everything.
func publishThroughOutbox(ctx context.Context, o options, pool *pgxpool.Pool, js jetstream.JetStream, msgs []order) error {
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

	tp := o.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	tracer := tp.Tracer("github.com/exactlyonce/dedupe/examples/quickstart")
	for _, ord := range msgs {
		if err := placeOrder(ctx, tracer, pool, ob, ord); err != nil {
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

// placeOrder enqueues ord in the outbox in a transaction of its own, inside
// a "place order" span.
func placeOrder(ctx context.Context, tracer trace.Tracer, pool *pgxpool.Pool, ob *outbox.Outbox, ord order) error {
	ctx, span := tracer.Start(ctx, "place order", trace.WithAttributes(attribute.String("order.id", ord.ID)))
	defer span.End()
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
