package badinput_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
)

// TestRabbitMQAdapterRefusals: the RabbitMQ runner and outbox publisher
// refuse configurations that would lose a message, ack the wrong one, or
// let the broker give up before the inbox records it.
func TestRabbitMQAdapterRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const url = "amqp://guest:guest@127.0.0.1:1/"
	h := func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error { return nil }
	newRunner := func(url, queue string, cfg dedupeamqp.Config) error {
		_, err := dedupeamqp.New(e.inbox, url, queue, cfg, h)
		return err
	}
	cases := map[string]func() error{
		"nil inbox": func() error { _, err := dedupeamqp.New(nil, url, "q", dedupeamqp.Config{}, h); return err },
		"nil handler": func() error {
			_, err := dedupeamqp.New[pgx.Tx](e.inbox, url, "q", dedupeamqp.Config{}, nil)
			return err
		},
		"not an AMQP URL":  func() error { return newRunner("http://127.0.0.1/", "q", dedupeamqp.Config{}) },
		"no queue":         func() error { return newRunner(url, "", dedupeamqp.Config{}) },
		"scope with a NUL": func() error { return newRunner(url, "q", dedupeamqp.Config{Scope: "a\x00"}) },
		"client recovery": func() error {
			return newRunner(url, "q", dedupeamqp.Config{AMQP: amqp.Config{Recovery: &amqp.Recovery{}}})
		},
		"prefetch below workers": func() error { return newRunner(url, "q", dedupeamqp.Config{Workers: 8, Prefetch: 2}) },
		"prefetch over 65535":    func() error { return newRunner(url, "q", dedupeamqp.Config{Prefetch: 70000}) },
		"attempts past the delivery limit": func() error {
			return newRunner(url, "q", dedupeamqp.Config{DeliveryLimit: 2, MaxAttempts: 4})
		},
		"publisher: not an AMQP URL": func() error {
			_, err := dedupeamqp.NewOutboxPublisher("nats://127.0.0.1:4222", dedupeamqp.OutboxPublisherConfig{})
			return err
		},
		"publisher: client recovery": func() error {
			_, err := dedupeamqp.NewOutboxPublisher(url, dedupeamqp.OutboxPublisherConfig{AMQP: amqp.Config{Recovery: &amqp.Recovery{}}})
			return err
		},
	}
	assertConfigErrors(t, cases, map[string]string{
		"nil inbox": "inbox", "nil handler": "handler", "not an AMQP URL": "url", "no queue": "queue",
		"scope with a NUL": "Scope", "client recovery": "AMQP.Recovery", "prefetch below workers": "Prefetch",
		"prefetch over 65535": "Prefetch", "attempts past the delivery limit": "MaxAttempts",
		"publisher: not an AMQP URL": "url", "publisher: client recovery": "AMQP.Recovery",
	})
}
