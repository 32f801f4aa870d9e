package dedupeamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// OrderKeyHeader carries an outbox message's Key (its order key), when it
// has one.
const OrderKeyHeader = "Dedupe-Order-Key"

// OutboxPublisherConfig configures an OutboxPublisher. The zero value is
// usable.
type OutboxPublisherConfig struct {
	// Exchange is the exchange messages are published to. Defaults to ""
	// (the default exchange, which routes by queue name).
	Exchange string
	// RoutingKey maps an outbox message's Topic to its routing key. Defaults
	// to the Topic itself (with the default exchange: the queue's name).
	RoutingKey func(topic string) string
	// AMQP is the connection's configuration. Its Recovery must be nil: the
	// publisher dials again itself when its connection closed. Its Dial
	// defaults to amqp.DefaultDial(10s).
	AMQP amqp.Config
}

// OutboxPublisher publishes dedupe outbox messages to RabbitMQ for a
// outbox.Relay, on a channel in confirm mode, with the mandatory flag and
// persistent delivery. A message counts as published only once the broker
// confirmed it; one it returned because no queue is bound to take it is a
// failed publish (matching ErrUnroutable), retried by the relay and parked
// after its attempts, like a nack or a connection lost before the confirm.
//
// Each message carries its outbox ID as the message_id property, which a
// Runner with DefaultKey claims in its inbox (RabbitMQ has no duplicate
// window: a relay that died after the publish and before recording it sends
// the message again, and the inbox absorbs the copy), its order key as
// OrderKeyHeader, and its headers as AMQP headers: the trace context the
// relay's Observer wrote (traceparent, tracestate), which the consuming
// Runner's Observer reads back.
//
// The publisher owns its connection: it dials on first use and again after
// the connection or channel closed. Close it when done.
type OutboxPublisher struct {
	url string
	cfg OutboxPublisherConfig

	mu   sync.Mutex
	conn *amqp.Connection
	pub  *confirmer
}

// NewOutboxPublisher returns a publisher to the broker at url; the zero
// OutboxPublisherConfig is the defaults. It does not connect yet.
func NewOutboxPublisher(url string, cfg OutboxPublisherConfig) (*OutboxPublisher, error) {
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, &dedupe.ConfigError{Field: "url", Reason: err.Error()}
	}
	if cfg.AMQP.Recovery != nil {
		return nil, &dedupe.ConfigError{Field: "AMQP.Recovery", Reason: "must be nil: the publisher dials again itself"}
	}
	c := cfg
	if c.RoutingKey == nil {
		c.RoutingKey = func(topic string) string { return topic }
	}
	if c.AMQP.Dial == nil {
		c.AMQP.Dial = amqp.DefaultDial(DefaultDialTimeout)
	}
	return &OutboxPublisher{url: url, cfg: c}, nil
}

var (
	_ outbox.Publisher     = (*OutboxPublisher)(nil)
	_ outbox.HealthChecker = (*OutboxPublisher)(nil)
)

// channel returns the publisher's confirm channel, dialing and opening it
// when needed.
func (p *OutboxPublisher) channel() (*confirmer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub != nil && !p.pub.ch.IsClosed() {
		return p.pub, nil
	}
	if p.conn == nil || p.conn.IsClosed() {
		if p.conn != nil {
			_ = p.conn.Close()
		}
		conn, err := amqp.DialConfig(p.url, p.cfg.AMQP)
		if err != nil {
			p.conn = nil
			return nil, fmt.Errorf("dedupeamqp: dial: %w", err)
		}
		p.conn = conn
	}
	c, err := openConfirmer(p.conn)
	if err != nil {
		_ = p.conn.Close()
		p.conn = nil
		return nil, fmt.Errorf("dedupeamqp: %w", err)
	}
	p.pub = c
	return c, nil
}

// Publish publishes msgs and waits until the broker confirmed, returned or
// nacked each one, or ctx ends. It implements outbox.Publisher.
func (p *OutboxPublisher) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	errs := make([]error, len(msgs))
	c, err := p.channel()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	out := make([]outgoing, len(msgs))
	for i, m := range msgs {
		h := amqp.Table{}
		for k, vs := range m.Headers {
			switch len(vs) {
			case 0:
			case 1:
				h[k] = vs[0]
			default:
				a := make([]any, len(vs))
				for j, v := range vs {
					a[j] = v
				}
				h[k] = a
			}
		}
		if m.Key != "" {
			h[OrderKeyHeader] = m.Key
		}
		pub := amqp.Publishing{Headers: h, MessageId: m.ID, DeliveryMode: amqp.Persistent, Body: m.Payload}
		if !m.CreatedAt.IsZero() {
			pub.Timestamp = m.CreatedAt
		}
		out[i] = outgoing{exchange: p.cfg.Exchange, key: p.cfg.RoutingKey(m.Topic), msg: pub}
	}
	res := c.publish(ctx, out)
	failed := false
	for i, err := range res {
		if err != nil {
			errs[i] = err
			failed = true
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// healthTimeout bounds CheckHealth called with a context without deadline.
const healthTimeout = 5 * time.Second

// CheckHealth returns nil when the publisher's connection is open, or it
// can dial the broker. It implements outbox.HealthChecker, which the relay
// asks when a cycle published nothing: while it fails the failures are an
// outage (no attempt counted, nothing parked). A broker that answers says
// the failures are the messages' (unroutable, nacked).
func (p *OutboxPublisher) CheckHealth(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, healthTimeout)
		defer cancel()
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.channel()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("dedupeamqp: broker unreachable: %w", ctx.Err())
	}
}

// Close closes the publisher's connection.
func (p *OutboxPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pub = nil
	if p.conn == nil {
		return nil
	}
	err := p.conn.Close()
	p.conn = nil
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}
