package dedupewatermill

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// MetadataOrderKey is the metadata entry that carries an outbox message's
// Key (its ordering key) through OutboxPublisher and RelayPublisher.
const MetadataOrderKey = "dedupe_order_key"

// OutboxPublisher is a message.Publisher that writes messages to the
// transactional outbox, in the transaction of each message's context (the
// one the Middleware gives a handler, found with Tx): a handler that
// publishes through it (a CQRS EventBus given the message's context)
// produces its messages if and only if its effects commit. A message whose
// context holds no such transaction is refused with ErrNoTx. The message's
// UUID becomes the outbox id, its metadata the headers (MetadataOrderKey the
// Key).
type OutboxPublisher struct {
	outbox *outbox.Outbox
}

var _ message.Publisher = (*OutboxPublisher)(nil)

// NewOutboxPublisher returns an OutboxPublisher writing to ob.
func NewOutboxPublisher(ob *outbox.Outbox) (*OutboxPublisher, error) {
	if ob == nil {
		return nil, &dedupe.ConfigError{Field: "outbox", Reason: "must not be nil"}
	}
	return &OutboxPublisher{outbox: ob}, nil
}

// Publish writes msgs to the outbox under topic.
func (p *OutboxPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		ctx := msg.Context()
		tx := ctx.Value(txKey{})
		if tx == nil {
			return fmt.Errorf("%w: message %s", ErrNoTx, msg.UUID)
		}
		q, err := querier(tx)
		if err != nil {
			return err
		}
		if _, err := p.outbox.Enqueue(ctx, q, outboxMessage(topic, msg)); err != nil {
			return fmt.Errorf("dedupewatermill: write message %s to the outbox: %w", msg.UUID, err)
		}
	}
	return nil
}

// Close does nothing: the outbox belongs to its owner.
func (p *OutboxPublisher) Close() error { return nil }

// outboxMessage is the outbox message for a Watermill message.
func outboxMessage(topic string, msg *message.Message) outbox.Message {
	out := outbox.Message{ID: msg.UUID, Topic: topic, Payload: msg.Payload}
	if len(msg.Metadata) > 0 {
		out.Headers = make(map[string][]string, len(msg.Metadata))
		for k, v := range msg.Metadata {
			if k == MetadataOrderKey {
				out.Key = v
				continue
			}
			out.Headers[k] = []string{v}
		}
	}
	return out
}

// RelayPublisherConfig configures a RelayPublisher. The zero value is
// usable.
type RelayPublisherConfig struct {
	// Topic maps an outbox message's Topic to the Watermill topic. Defaults
	// to the Topic itself.
	Topic func(topic string) string
}

// RelayPublisher is a outbox.Publisher over any Watermill publisher, for a
// outbox.Relay: each outbox message goes out as a Watermill message whose
// UUID is the outbox id (so UUIDKey claims it downstream, and a relay's
// re-send is absorbed as a duplicate), whose metadata are the headers (the
// trace context) and MetadataOrderKey the Key.
type RelayPublisher struct {
	pub message.Publisher
	cfg RelayPublisherConfig
}

// NewRelayPublisher returns a RelayPublisher over pub.
func NewRelayPublisher(pub message.Publisher, cfg RelayPublisherConfig) (*RelayPublisher, error) {
	if pub == nil {
		return nil, &dedupe.ConfigError{Field: "pub", Reason: "must not be nil"}
	}
	if cfg.Topic == nil {
		cfg.Topic = func(topic string) string { return topic }
	}
	return &RelayPublisher{pub: pub, cfg: cfg}, nil
}

// Publish publishes msgs one by one (Watermill's Publish returns once the
// Pub/Sub accepted the message) and returns one error per message, or nil.
func (p *RelayPublisher) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	var errs []error
	for i, m := range msgs {
		wm := message.NewMessage(m.ID, m.Payload)
		for k, vs := range m.Headers {
			if len(vs) > 0 {
				wm.Metadata.Set(k, vs[0])
			}
		}
		if m.Key != "" {
			wm.Metadata.Set(MetadataOrderKey, m.Key)
		}
		wm.SetContext(ctx)
		if err := p.pub.Publish(p.cfg.Topic(m.Topic), wm); err != nil {
			if errs == nil {
				errs = make([]error, len(msgs))
			}
			errs[i] = err
		}
	}
	return errs
}
