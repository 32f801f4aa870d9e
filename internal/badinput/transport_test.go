package badinput_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/outbox"
)

// TestOutboxRefusals: Enqueue refuses malformed messages with a
// *MessageError naming the field, and writes nothing.
func TestOutboxRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	ob, err := outbox.New(e.db.Pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		msg   outbox.Message
		field string
	}{
		{"no topic", outbox.Message{ID: "m1"}, "Topic"},
		{"topic of 256 bytes", outbox.Message{ID: "m1", Topic: strings.Repeat("t", 256)}, "Topic"},
		{"topic with a newline", outbox.Message{ID: "m1", Topic: "orders\n"}, "Topic"},
		{"topic of invalid UTF-8", outbox.Message{ID: "m1", Topic: "\xff"}, "Topic"},
		{"id of 256 bytes", outbox.Message{ID: strings.Repeat("i", 256), Topic: "orders"}, "ID"},
		{"id with a NUL", outbox.Message{ID: "m\x00", Topic: "orders"}, "ID"},
		{"key of 256 bytes", outbox.Message{ID: "m1", Topic: "orders", Key: strings.Repeat("k", 256)}, "Key"},
		{"key with a control char", outbox.Message{ID: "m1", Topic: "orders", Key: "a\x1bb"}, "Key"},
	}
	for _, c := range cases {
		err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(ctx, tx, c.msg)
			return err
		})
		var me *outbox.MessageError
		if !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) || me.Field != c.field {
			t.Errorf("%s: err = %v, want a *MessageError for %s matching ErrInvalidMessage", c.name, err, c.field)
		}
	}
	if _, err := ob.Enqueue(ctx, nil, outbox.Message{Topic: "orders"}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Errorf("Enqueue(nil tx) = %v, want ErrInvalidConfig", err)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM "+dedupe.DefaultOutboxTable); n != 0 {
		t.Errorf("outbox rows = %d, want 0", n)
	}

	pub := publisherFunc(func(context.Context, []*outbox.StoredMessage) []error { return nil })
	relays := map[string]func() error{
		"nil outbox":         func() error { _, err := outbox.NewRelay(nil, pub, outbox.RelayConfig{}); return err },
		"nil publisher":      func() error { _, err := outbox.NewRelay(ob, nil, outbox.RelayConfig{}); return err },
		"negative BatchSize": func() error { _, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{BatchSize: -1}); return err },
		"MaxBackoff < MinBackoff": func() error {
			_, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{MinBackoff: time.Minute, MaxBackoff: time.Second})
			return err
		},
	}
	assertConfigErrors(t, relays, map[string]string{
		"nil outbox": "outbox", "nil publisher": "publisher", "negative BatchSize": "BatchSize",
		"MaxBackoff < MinBackoff": "MaxBackoff",
	})
	e.assertNothingWritten(t)
}

// assertConfigErrors fails unless each case returns a *dedupe.ConfigError
// (matching ErrInvalidConfig) that names the field fields gives for it.
func assertConfigErrors(t *testing.T, cases map[string]func() error, fields map[string]string) {
	t.Helper()
	for name, call := range cases {
		want, ok := fields[name]
		if !ok {
			t.Fatalf("%s: no field given for the case", name)
		}
		var ce *dedupe.ConfigError
		if err := call(); !errors.Is(err, dedupe.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != want {
			t.Errorf("%s: err = %v, want a *dedupe.ConfigError for field %q", name, err, want)
		}
	}
}

type publisherFunc func(ctx context.Context, msgs []*outbox.StoredMessage) []error

func (f publisherFunc) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	return f(ctx, msgs)
}

// TestKafkaAdapterRefusals: the Kafka runner and outbox publisher refuse
// configurations that would lose or reorder messages.
func TestKafkaAdapterRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error { return nil }
	reader := func(group string) kafka.ReaderConfig {
		return kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: group, Topic: "t"}
	}
	noGroup := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t"}
	if _, err := dedupekafka.New(e.inbox, noGroup, dedupekafka.Config{}, h); !errors.Is(err, dedupekafka.ErrNoGroup) {
		t.Errorf("New without GroupID = %v, want ErrNoGroup", err)
	}
	cases := map[string]func() error{
		"nil inbox": func() error { _, err := dedupekafka.New(nil, reader("g"), dedupekafka.Config{}, h); return err },
		"nil handler": func() error {
			_, err := dedupekafka.New(e.inbox, reader("g"), dedupekafka.Config{}, dedupekafka.HandlerFunc(nil))
			return err
		},
		"BatchSize -1": func() error {
			_, err := dedupekafka.New(e.inbox, reader("g"), dedupekafka.Config{BatchSize: -1}, h)
			return err
		},
		"negative Linger": func() error {
			_, err := dedupekafka.New(e.inbox, reader("g"), dedupekafka.Config{Linger: -1}, h)
			return err
		},
		"scope with a NUL": func() error {
			_, err := dedupekafka.New(e.inbox, reader("g"), dedupekafka.Config{Scope: "a\x00"}, h)
			return err
		},
		"MaxRetryBackoff < RetryBackoff": func() error {
			_, err := dedupekafka.New(e.inbox, reader("g"), dedupekafka.Config{RetryBackoff: time.Second, MaxRetryBackoff: time.Millisecond}, h)
			return err
		},
		"publisher: nil writer": func() error {
			_, err := dedupekafka.NewOutboxPublisher(nil, dedupekafka.OutboxPublisherConfig{})
			return err
		},
		"publisher: writer with a Topic": func() error {
			_, err := dedupekafka.NewOutboxPublisher(&kafka.Writer{Topic: "t", RequiredAcks: kafka.RequireAll, Balancer: &kafka.Hash{}}, dedupekafka.OutboxPublisherConfig{})
			return err
		},
		"publisher: RequireOne": func() error {
			_, err := dedupekafka.NewOutboxPublisher(&kafka.Writer{RequiredAcks: kafka.RequireOne, Balancer: &kafka.Hash{}}, dedupekafka.OutboxPublisherConfig{})
			return err
		},
		"publisher: Async": func() error {
			_, err := dedupekafka.NewOutboxPublisher(&kafka.Writer{RequiredAcks: kafka.RequireAll, Async: true, Balancer: &kafka.Hash{}}, dedupekafka.OutboxPublisherConfig{})
			return err
		},
		"publisher: round-robin": func() error {
			_, err := dedupekafka.NewOutboxPublisher(&kafka.Writer{RequiredAcks: kafka.RequireAll, Balancer: &kafka.RoundRobin{}}, dedupekafka.OutboxPublisherConfig{})
			return err
		},
	}
	assertConfigErrors(t, cases, map[string]string{
		"nil inbox": "inbox", "nil handler": "handler", "BatchSize -1": "BatchSize", "negative Linger": "Linger",
		"scope with a NUL": "Scope", "MaxRetryBackoff < RetryBackoff": "MaxRetryBackoff",
		"publisher: nil writer": "writer", "publisher: writer with a Topic": "writer.Topic",
		"publisher: RequireOne": "writer.RequiredAcks", "publisher: Async": "writer.Async",
		"publisher: round-robin": "writer.Balancer",
	})
	e.assertNothingWritten(t)
}

// TestNATSAdapterRefusals: the JetStream runner refuses missing parts and a
// consumer whose acknowledgements could lose messages.
func TestNATSAdapterRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BAD", Subjects: []string{"bad.>"}}); err != nil {
		t.Fatal(err)
	}
	ackNone, err := js.CreateOrUpdateConsumer(ctx, "BAD", jetstream.ConsumerConfig{Durable: "none", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	good, err := js.CreateOrUpdateConsumer(ctx, "BAD", jetstream.ConsumerConfig{Durable: "good", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error { return nil }
	cases := map[string]func() error{
		"nil inbox":    func() error { _, err := dedupenats.New(nil, good, dedupenats.Config{}, h); return err },
		"nil consumer": func() error { _, err := dedupenats.New(e.inbox, nil, dedupenats.Config{}, h); return err },
		"nil handler": func() error {
			_, err := dedupenats.New(e.inbox, good, dedupenats.Config{}, dedupe.HandlerFunc[jetstream.Msg](nil))
			return err
		},
		"AckNone consumer": func() error { _, err := dedupenats.New(e.inbox, ackNone, dedupenats.Config{}, h); return err },
		"Open without Durable": func() error {
			_, err := dedupenats.Open(ctx, e.inbox, js, "BAD", jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy}, dedupenats.Config{}, h)
			return err
		},
		"Open with AckAll": func() error {
			_, err := dedupenats.Open(ctx, e.inbox, js, "BAD", jetstream.ConsumerConfig{Durable: "all", AckPolicy: jetstream.AckAllPolicy}, dedupenats.Config{}, h)
			return err
		},
		"outbox publisher without js": func() error {
			_, err := dedupenats.NewOutboxPublisher(nil, dedupenats.OutboxPublisherConfig{})
			return err
		},
	}
	assertConfigErrors(t, cases, map[string]string{
		"nil inbox": "inbox", "nil consumer": "consumer", "nil handler": "handler", "AckNone consumer": "consumer",
		"Open without Durable": "ConsumerConfig.Durable", "Open with AckAll": "ConsumerConfig.AckPolicy",
		"outbox publisher without js": "js",
	})
	e.assertNothingWritten(t)
}
