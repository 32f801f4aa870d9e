package dedupenats

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// OutboxPublisherConfig configures an OutboxPublisher. The zero value is
// usable.
type OutboxPublisherConfig struct {
	// Subject maps an outbox message's Topic to the subject it is published
	// on. Defaults to the Topic itself.
	Subject func(topic string) string
	// Stream, when set, makes JetStream refuse a message whose subject is not
	// captured by this stream (WithExpectStream). Defaults to "" (any
	// stream).
	Stream string
}

// OutboxPublisher publishes dedupe outbox messages to JetStream for a
// outbox.Relay. Each message carries its outbox ID as the Nats-Msg-Id header,
// so the stream's duplicate window drops the re-send of a relay that died
// after the publish and before recording it, and a consumer using DefaultKey
// claims the same ID in its inbox. A batch is published asynchronously and
// Publish waits for every acknowledgement.
type OutboxPublisher struct {
	js         jetstream.JetStream
	cfg        OutboxPublisherConfig
	duplicates atomic.Int64
}

// NewOutboxPublisher returns a publisher over js; the zero
// OutboxPublisherConfig is the defaults.
func NewOutboxPublisher(js jetstream.JetStream, cfg OutboxPublisherConfig) (*OutboxPublisher, error) {
	if js == nil {
		return nil, &dedupe.ConfigError{Field: "js", Reason: "must not be nil"}
	}
	c := cfg
	if c.Subject == nil {
		c.Subject = func(topic string) string { return topic }
	}
	return &OutboxPublisher{js: js, cfg: c}, nil
}

var _ outbox.HealthChecker = (*OutboxPublisher)(nil)

// healthTimeout bounds CheckHealth called with a context without deadline.
const healthTimeout = 5 * time.Second

// CheckHealth returns nil when the NATS server answers a ping on js's
// connection within ctx, and an error when the connection is down or
// reconnecting. It implements outbox.HealthChecker, which the relay asks
// when a cycle published nothing: while it fails the failures are an outage
// (no attempt counted, nothing parked, the relay pauses), however few keys
// the backlog holds. A server that answers says the failures are the
// messages' (a subject no stream captures, a stream that refuses them).
func (p *OutboxPublisher) CheckHealth(ctx context.Context) error {
	nc := p.js.Conn()
	if nc == nil {
		return errors.New("dedupenats: no NATS connection")
	}
	if _, ok := ctx.Deadline(); !ok {
		// FlushWithContext needs a deadline; the relay always gives one.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, healthTimeout)
		defer cancel()
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("dedupenats: NATS server unreachable (%s): %w", nc.Status(), err)
	}
	return nil
}

// Duplicates returns how many publishes the stream acknowledged as
// duplicates of a message it already held (dropped by Nats-Msg-Id).
func (p *OutboxPublisher) Duplicates() int64 { return p.duplicates.Load() }

// Publish sends msgs with PublishMsgAsync and waits until each one is
// acknowledged by the stream, refused, or ctx ends. It implements
// outbox.Publisher. A message larger than the server allows is reported as
// dedupe.Permanent, so the relay parks it at once.
func (p *OutboxPublisher) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	errs := make([]error, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	var opts []jetstream.PublishOpt
	if p.cfg.Stream != "" {
		opts = append(opts, jetstream.WithExpectStream(p.cfg.Stream))
	}
	for i, m := range msgs {
		nm := &nats.Msg{Subject: p.cfg.Subject(m.Topic), Data: m.Payload, Header: nats.Header{}}
		for k, vs := range m.Headers {
			for _, v := range vs {
				nm.Header.Add(k, v)
			}
		}
		// WithMsgID sets the Nats-Msg-Id header.
		f, err := p.js.PublishMsgAsync(nm, append(opts, jetstream.WithMsgID(m.ID))...)
		if err != nil {
			errs[i] = classify(err)
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				p.duplicates.Add(1)
			}
		case err := <-f.Err():
			errs[i] = classify(err)
		case <-ctx.Done():
			errs[i] = fmt.Errorf("dedupenats: waiting for the ack of %s: %w", msgs[i].ID, ctx.Err())
		}
	}
	return errs
}

// classify marks the errors that retrying cannot fix as permanent.
func classify(err error) error {
	if errors.Is(err, nats.ErrMaxPayload) {
		return dedupe.Permanent(err)
	}
	return err
}
