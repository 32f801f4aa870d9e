package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/internal/amqptest"
)

// amqpQueue empties the run's effects (reset), declares a queue of its own
// on the machine's RabbitMQ (AMQP_URL, else
// amqp://guest:guest@127.0.0.1:5672/) for one run and publishes its backlog
// with confirms, each message with a unique Order-Id. cleanup deletes the
// queue.
func (b *bench) amqpQueue(ctx context.Context, backlog int64) (url, queue string, cleanup func(), err error) {
	if err := b.reset(ctx, b.run); err != nil {
		return "", "", nil, err
	}
	url = amqptest.URL()
	conn, err := amqptest.DialURL(url)
	if err != nil {
		return "", "", nil, fmt.Errorf("RabbitMQ does not answer at %s: %w (start it: rabbitmq-server -detached; or set AMQP_URL)", amqptest.Redact(url), err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return "", "", nil, err
	}
	queue = "dedupe-bench-" + b.run + "-" + strconv.FormatInt(b.seq.Add(1), 10)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return "", "", nil, err
	}
	cleanup = func() { amqptest.Delete(queue, "") }
	if err := ch.Confirm(false); err != nil {
		cleanup()
		return "", "", nil, err
	}
	var pending []*amqp.DeferredConfirmation
	for i := range backlog {
		id := b.run + "-" + strconv.FormatInt(i, 10)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			Headers: amqp.Table{idHeader: id}, MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(body),
		})
		if err != nil {
			cleanup()
			return "", "", nil, err
		}
		pending = append(pending, dc)
		if len(pending) == 1000 || i == backlog-1 {
			for _, dc := range pending {
				if ok, err := dc.WaitContext(ctx); err != nil || !ok {
					cleanup()
					return "", "", nil, errors.Join(err, errors.New("publish not confirmed"))
				}
			}
			pending = pending[:0]
		}
	}
	return url, queue, cleanup, nil
}

// amqpHand is the hand-written amqp091-go consumer: one channel with the
// runner's prefetch (max(2×workers, 8)) and manual acks feeding w workers,
// each running the hand-written claim + effect transaction, committing, then
// acking (a failed transaction is nacked with requeue) (handConsume).
func (b *bench) amqpHand(ctx context.Context, w int, sp span) (*sample, error) {
	url, queue, cleanup, err := b.amqpQueue(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	conn, err := amqptest.DialURL(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(max(2*w, dedupeamqp.DefaultMinPrefetch), 0, false); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(queue, "bench-hand", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	win := newWindow(sp)
	return b.drainRow(ctx, win, func(rctx context.Context) (func() error, error) {
		var wg sync.WaitGroup
		for range w {
			wg.Go(func() {
				handConsume(rctx, b, win, deliveries,
					func(d amqp.Delivery) string { id, _ := d.Headers[idHeader].(string); return id },
					func(d amqp.Delivery) error { return d.Ack(false) },
					func(d amqp.Delivery) { _ = d.Nack(false, true) })
			})
		}
		return func() error { wg.Wait(); return nil }, nil
	})
}

// amqpRunner drains the same backlog with dedupeamqp.Runner (its default
// prefetch) (runnerRow).
func (b *bench) amqpRunner(ctx context.Context, w int, sp span) (*sample, error) {
	url, queue, cleanup, err := b.amqpQueue(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return b.runnerRow(ctx, sp, func(inbox *dedupe.Inbox) (runner, error) {
		return dedupeamqp.New(inbox, url, queue, dedupeamqp.Config{
			Scope:   benchScope,
			Key:     dedupeamqp.HeaderKey(idHeader),
			Workers: w,
		}, effect[amqp.Delivery])
	})
}
