package dedupekafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// DefaultOutboxIDHeader is the header that carries an outbox message's ID.
const DefaultOutboxIDHeader = "message-id"

// OutboxPublisherConfig configures an OutboxPublisher. The zero value is
// usable.
type OutboxPublisherConfig struct {
	// IDHeader names the header carrying the outbox message's ID, for the
	// consumer's inbox to claim (KeyFromHeaders). Defaults to "message-id".
	IDHeader string
}

// OutboxPublisher publishes dedupe outbox messages to Kafka through a
// kafka.Writer for a outbox.Relay: the outbox Topic is the Kafka topic, the
// Key is the record key (so a key stays on one partition, in order), and the
// message ID travels in the message-id header. The writer waits for all
// in-sync replicas (RequiredAcks all) before a message counts as published.
// Kafka has no broker-side deduplication here: a relay that dies after the
// write and before recording it sends the message again, and the consumer's
// inbox drops it by the ID.
type OutboxPublisher struct {
	w   *kafka.Writer
	cfg OutboxPublisherConfig
}

// NewOutboxWriter returns a kafka.Writer fit for an OutboxPublisher: no
// default topic, keys hashed onto partitions (kafka.Hash), RequiredAcks all,
// synchronous, and a short batch timeout (the relay hands over whole
// batches, so waiting for more only adds latency). The caller closes it.
func NewOutboxWriter(brokers ...string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
	}
}

// NewOutboxPublisher returns a publisher over w, which must have no Topic
// (each message names its own), RequiredAcks set to kafka.RequireAll, Async
// off, and a Balancer that keeps a key on one partition (not round-robin).
// The zero OutboxPublisherConfig is the defaults.
func NewOutboxPublisher(w *kafka.Writer, cfg OutboxPublisherConfig) (*OutboxPublisher, error) {
	c := cfg
	if c.IDHeader == "" {
		c.IDHeader = DefaultOutboxIDHeader
	}
	switch {
	case w == nil:
		return nil, &dedupe.ConfigError{Field: "writer", Reason: "must not be nil"}
	case w.Topic != "":
		return nil, &dedupe.ConfigError{Field: "writer.Topic", Reason: "must be empty: each outbox message names its topic"}
	case w.RequiredAcks != kafka.RequireAll:
		return nil, &dedupe.ConfigError{Field: "writer.RequiredAcks", Reason: "must be kafka.RequireAll"}
	case w.Async:
		return nil, &dedupe.ConfigError{Field: "writer.Async", Reason: "must be false: the relay needs the broker's confirmation"}
	}
	if _, rr := w.Balancer.(*kafka.RoundRobin); w.Balancer == nil || rr {
		return nil, &dedupe.ConfigError{Field: "writer.Balancer", Reason: "must map a key to one partition (e.g. &kafka.Hash{}); round-robin breaks per-key order"}
	}
	return &OutboxPublisher{w: w, cfg: c}, nil
}

var _ outbox.HealthChecker = (*OutboxPublisher)(nil)

// CheckHealth returns nil when the writer can reach its cluster: a broker
// answers an ApiVersions request (a round trip) within ctx, and the writer's
// transport has the cluster's metadata (kafka-go routes every write by its
// cached metadata, and while its last refresh failed it fails every write,
// for a while after the brokers are back). Otherwise it returns an error.
// It implements outbox.HealthChecker, which the relay asks when a cycle
// published nothing: while it fails the failures are an outage (no attempt
// counted, nothing parked, the relay pauses), however few keys the backlog
// holds. A cluster that answers says the failures are the messages' (an
// unknown topic, a partition without a leader).
func (p *OutboxPublisher) CheckHealth(ctx context.Context) error {
	c := &kafka.Client{Addr: p.w.Addr, Transport: p.w.Transport}
	res, err := c.ApiVersions(ctx, &kafka.ApiVersionsRequest{Addr: p.w.Addr})
	if err == nil {
		err = res.Error
	}
	if err == nil {
		// Served from the transport's cache: its error is the last refresh's.
		_, err = c.Metadata(ctx, &kafka.MetadataRequest{Addr: p.w.Addr})
	}
	if err != nil {
		return fmt.Errorf("dedupekafka: Kafka cluster unreachable: %w", err)
	}
	return nil
}

// Publish writes msgs with one WriteMessages call and reports each one's
// outcome. It implements outbox.Publisher. Errors Kafka documents as not
// retriable, and a message larger than the writer's BatchBytes, are
// reported as dedupe.Permanent, so the relay parks the message at once.
func (p *OutboxPublisher) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	kms := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		km := kafka.Message{Topic: m.Topic, Value: m.Payload,
			Headers: []kafka.Header{{Key: p.cfg.IDHeader, Value: []byte(m.ID)}}}
		if m.Key != "" {
			km.Key = []byte(m.Key)
		}
		for k, vs := range m.Headers {
			for _, v := range vs {
				km.Headers = append(km.Headers, kafka.Header{Key: k, Value: []byte(v)})
			}
		}
		kms[i] = km
	}
	err := p.w.WriteMessages(ctx, kms...)
	if err == nil {
		return nil
	}
	errs := make([]error, len(msgs))
	var (
		we  kafka.WriteErrors
		big kafka.MessageTooLargeError
	)
	switch {
	case errors.As(err, &we) && len(we) == len(msgs):
		for i, e := range we {
			errs[i] = classifyWrite(e)
		}
	case errors.As(err, &big):
		// WriteMessages refused the whole call for one message; the others
		// were not sent and are retried.
		for i, m := range kms {
			errs[i] = err
			if m.Topic == big.Message.Topic && string(m.Value) == string(big.Message.Value) &&
				string(m.Key) == string(big.Message.Key) {
				errs[i] = dedupe.Permanent(err)
			}
		}
	default:
		for i := range errs {
			errs[i] = classifyWrite(err)
		}
	}
	return errs
}

// classifyWrite marks the errors Kafka documents as not retriable permanent.
func classifyWrite(err error) error {
	var ke kafka.Error
	if err != nil && errors.As(err, &ke) && !ke.Temporary() {
		return dedupe.Permanent(err)
	}
	return err
}
