package deduperedis

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// Fields of an entry OutboxPublisher adds, besides one field per header of
// the outbox message (its trace context: traceparent, tracestate).
const (
	// PayloadField holds the outbox message's payload.
	PayloadField = "payload"
	// OrderKeyField holds the outbox message's Key, when it has one.
	OrderKeyField = "key"
)

// OutboxPublisherConfig configures an OutboxPublisher. The zero value is
// usable.
type OutboxPublisherConfig struct {
	// Stream maps an outbox message's Topic to the stream it is added to.
	// Defaults to the Topic itself.
	Stream func(topic string) string
}

// OutboxPublisher adds dedupe outbox messages to Redis streams (XADD) for a
// outbox.Relay. Each entry carries the outbox id in its "id" field
// (DefaultKeyField), which a Runner with DefaultKey claims in its inbox, the
// payload in PayloadField, the order key in OrderKeyField, and each header
// of the message as a field of its own: the trace context the relay's
// Observer wrote (traceparent, tracestate), which the consuming Runner's
// Observer reads back. A header named like one of those three fields is
// refused as permanent (the relay parks the message).
//
// Redis 7 has no duplicate window: a relay that dies after the XADD and
// before recording the publish adds the message again when it restarts, as
// a second entry with the same "id" field, which the consumer's inbox
// absorbs. A batch goes in one pipeline (one round trip).
type OutboxPublisher struct {
	rdb redis.Cmdable
	cfg OutboxPublisherConfig
}

// NewOutboxPublisher returns a publisher over rdb; the zero
// OutboxPublisherConfig is the defaults.
func NewOutboxPublisher(rdb redis.Cmdable, cfg OutboxPublisherConfig) (*OutboxPublisher, error) {
	if rdb == nil {
		return nil, &dedupe.ConfigError{Field: "rdb", Reason: "must not be nil"}
	}
	c := cfg
	if c.Stream == nil {
		c.Stream = func(topic string) string { return topic }
	}
	return &OutboxPublisher{rdb: rdb, cfg: c}, nil
}

var _ outbox.HealthChecker = (*OutboxPublisher)(nil)

// healthTimeout bounds CheckHealth called with a context without deadline.
const healthTimeout = 5 * time.Second

// CheckHealth returns nil when Redis answers a PING within ctx. It
// implements outbox.HealthChecker, which the relay asks when a cycle
// published nothing: while it fails, the failures are an outage (no attempt
// counted, nothing parked, the relay pauses).
func (p *OutboxPublisher) CheckHealth(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, healthTimeout)
		defer cancel()
	}
	if err := p.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("deduperedis: Redis unreachable: %w", err)
	}
	return nil
}

// Publish adds msgs to their streams in one pipeline and returns once Redis
// answered each XADD (or ctx ended). It implements outbox.Publisher. An
// XADD Redis refuses because the key holds something else than a stream
// (WRONGTYPE), and a message whose headers collide with the entry's own
// fields, are reported as dedupe.Permanent, so the relay parks them at once.
func (p *OutboxPublisher) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	errs := make([]error, len(msgs))
	cmds := make([]*redis.StringCmd, len(msgs))
	pipe := p.rdb.Pipeline()
	for i, m := range msgs {
		values, err := entryFields(m)
		if err != nil {
			errs[i] = dedupe.Permanent(err)
			continue
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: p.cfg.Stream(m.Topic), Values: values})
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	failed := false
	for i, c := range cmds {
		if c == nil {
			failed = true
			continue
		}
		if err := c.Err(); err != nil {
			failed = true
			if redis.HasErrorPrefix(err, "WRONGTYPE") {
				err = dedupe.Permanent(err)
			}
			errs[i] = fmt.Errorf("deduperedis: xadd %s to %s: %w", msgs[i].ID, p.cfg.Stream(msgs[i].Topic), err)
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// entryFields are the fields of the entry for m.
func entryFields(m *outbox.StoredMessage) ([]any, error) {
	out := make([]any, 0, 6+2*len(m.Headers))
	out = append(out, DefaultKeyField, m.ID, PayloadField, m.Payload)
	if m.Key != "" {
		out = append(out, OrderKeyField, m.Key)
	}
	for k, vs := range m.Headers {
		switch k {
		case DefaultKeyField, PayloadField, OrderKeyField:
			return nil, fmt.Errorf("deduperedis: header %q of outbox message %s collides with the entry's own field", k, m.ID)
		}
		out = append(out, k, strings.Join(vs, ","))
	}
	return out, nil
}
