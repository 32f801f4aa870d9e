package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/internal/amqptest"
)

// amqpIDHdr is the header of the amqp transport's business key.
const amqpIDHdr = "Order-Id"

// amqpCutEvery is how many committed effects pass between two cuts of the
// in-process runners' broker connections.
const amqpCutEvery = 40

// runAMQP soaks the RabbitMQ runner against the machine's broker (AMQP_URL,
// else amqp://guest:guest@127.0.0.1:5672/): a queue of its own with a
// dead-letter queue behind its dead-letter exchange, every input published
// with confirms, a fresh message_id and its id in the Order-Id header (the
// keyless inputs without it, so the runner records and dead-letters them),
// two in-process runners connected through a TCP proxy that cuts every
// broker connection every amqpCutEvery effects (one runner also stopped and
// restarted at random), and a worker subprocess on the same queue that is
// killed mid-transaction. The dead-letter queue is read as the run goes.
func runAMQP(ctx context.Context, e *env, inputs []string) error {
	conn, err := amqptest.DialURL(amqptest.URL())
	if err != nil {
		return fmt.Errorf("RabbitMQ does not answer at %s: %w (start it: rabbitmq-server -detached; or set AMQP_URL)", amqptest.Redact(amqptest.URL()), err)
	}
	defer func() { _ = conn.Close() }()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	queue := "dedupe-soak-" + hex.EncodeToString(rnd[:])
	dlq := queue + ".dlq"
	defer amqptest.Delete(queue, "")
	defer amqptest.Delete(dlq, "")
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare %s: %w", dlq, err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq,
	}); err != nil {
		return fmt.Errorf("declare %s: %w", queue, err)
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	proxy, err := amqptest.StartProxy()
	if err != nil {
		return err
	}
	defer proxy.Close()

	dead := &deadLetters{ids: map[string]bool{}}
	defer func() { e.deadLettered = dead.snapshot() }()

	o := e.soak.opts
	pool, inbox, err := e.consumerInbox(ctx, int32(o.workers)*2+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	handler := faultyHandler[amqp.Delivery](e, nil)

	// Cut every broker connection of the in-process runners, paced by
	// progress.
	defer e.every(ctx, amqpCutEvery, faultBrokerCut, func(context.Context) bool {
		proxy.Cut()
		return true
	})()

	// Every input designed to fail (keyless, or failing until poisoned)
	// ends with a copy in the dead-letter queue. The copy goes after the
	// key is recorded failed, and the queue's message count leaves out
	// unacknowledged messages: the run is done only once every copy is in.
	designed := e.countUnique(e.designedToFail)
	return runExternal(ctx, e, external{
		consumers: 2,
		consume: func(ctx context.Context, _ int) error {
			return runAMQPRunner(ctx, e, inbox, proxy.URL(), queue, handler, o.workers)
		},
		childArgs: []string{"-amqp-url", amqptest.URL(), "-amqp-queue", queue},
		feed: func(ctx context.Context) error {
			dcs := make([]*amqp.DeferredConfirmation, 0, len(inputs))
			for i, id := range inputs {
				h := amqp.Table{}
				if !e.withoutKey(id) {
					h[amqpIDHdr] = id
				}
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
					Headers: h, MessageId: "p-" + strconv.Itoa(i), DeliveryMode: amqp.Persistent, Body: []byte(id),
				})
				if err != nil {
					return fmt.Errorf("publish: %w", err)
				}
				dcs = append(dcs, dc)
			}
			for _, dc := range dcs {
				if ok, err := dc.WaitContext(ctx); err != nil {
					return nil // stopping
				} else if !ok {
					return errors.New("publish nacked by the broker")
				}
			}
			return nil
		},
		done: func(ctx context.Context) (bool, error) {
			if err := dead.drain(conn, dlq); err != nil {
				return false, err
			}
			if dead.count() < designed {
				return false, nil
			}
			q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			if err != nil {
				return false, err
			}
			if q.Messages > 0 {
				return false, nil
			}
			return e.settledInDB(ctx)
		},
	})
}

// deadLetters are the inputs found in the dead-letter queue (a copy's body
// is the input's id).
type deadLetters struct {
	mu  sync.Mutex
	ids map[string]bool
}

// drain takes what the dead-letter queue holds.
func (d *deadLetters) drain(conn *amqp.Connection, dlq string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	for {
		m, ok, err := ch.Get(dlq, true)
		if err != nil || !ok {
			return err
		}
		d.mu.Lock()
		d.ids[string(m.Body)] = true
		d.mu.Unlock()
	}
}

func (d *deadLetters) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ids)
}

func (d *deadLetters) snapshot() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]bool, len(d.ids))
	for k := range d.ids {
		out[k] = true
	}
	return out
}

// runAMQPRunner runs one in-process dedupeamqp.Runner on queue until ctx
// ends, counting every handling of a redelivered message as a broker
// redelivery, as its inbox's Observer is told.
func runAMQPRunner(ctx context.Context, e *env, inbox *dedupe.Inbox, url, queue string, h dedupe.HandlerFunc[amqp.Delivery], workers int) error {
	inbox, err := e.countingRedeliveries(inbox)
	if err != nil {
		return err
	}
	r, err := dedupeamqp.New(inbox, url, queue, amqpConfig(e.scope, workers), h)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// amqpConfig is the runners' configuration: the business key from the
// Order-Id header, short delays.
func amqpConfig(scope string, workers int) dedupeamqp.Config {
	return dedupeamqp.Config{
		Scope:         scope,
		Key:           dedupeamqp.HeaderKey(amqpIDHdr),
		Workers:       workers,
		Backoff:       func(int) time.Duration { return 20 * time.Millisecond },
		InFlightDelay: 50 * time.Millisecond,
		DrainTimeout:  2 * time.Second,
		Reconnect:     dedupe.Backoff{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond, Jitter: 0.2},
	}
}

// amqpChild is the RabbitMQ worker subprocess: one runner on the soak's
// queue, connected to the broker directly.
func amqpChild(ctx context.Context, e *env, fl *childFlags, say func(verb, arg string)) error {
	pool, inbox, err := e.consumerInbox(ctx, 3)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := dedupeamqp.New(inbox, fl.amqpURL, fl.amqpQueue, amqpConfig(e.scope, 2), childHandler[amqp.Delivery](e, say))
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
