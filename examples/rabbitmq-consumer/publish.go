package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe/examples/shipping"
)

// publishOrder publishes body, one order, to the queue (through the default
// exchange) with publisher confirms and the mandatory flag, and returns once
// the broker confirmed it. The order's id is its message_id and, with
// KEY_HEADER set, that header's value. It declares the queue as the consumer
// does, so that an order published before any consumer started is kept.
func publishOrder(ctx context.Context, cfg config, body []byte, out io.Writer) error {
	var o shipping.Order
	if err := json.Unmarshal(body, &o); err != nil || o.ID == "" {
		return fmt.Errorf("-publish wants an order such as {\"id\":\"order-1\",\"item\":\"book\",\"qty\":1}: %v", err)
	}
	if err := declareQueue(cfg.AMQPURL, cfg.Queue); err != nil {
		return err
	}
	conn, err := amqp.Dial(cfg.AMQPURL)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ at %s: %w", redact(cfg.AMQPURL), err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	h := amqp.Table{}
	if cfg.KeyHeader != "" {
		h[cfg.KeyHeader] = o.ID
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", cfg.Queue, true, false, amqp.Publishing{
		Headers: h, MessageId: o.ID, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
	})
	if err != nil {
		return err
	}
	acked, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("waiting for the broker's confirm: %w", err)
	case !acked:
		return errors.New("the broker nacked the publish")
	}
	select {
	case r := <-returns:
		return fmt.Errorf("the broker returned the order: %d %s", r.ReplyCode, r.ReplyText)
	default:
	}
	_, err = fmt.Fprintf(out, "published %s to %s\n", o.ID, cfg.Queue)
	return err
}
