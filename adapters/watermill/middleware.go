package dedupewatermill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactlyonce/dedupe"
)

// Middleware runs Watermill handlers inside dedupe's transaction. Build it
// with New and add Middleware.Handler to a router (router.AddMiddleware) or
// to one handler (Handler.AddMiddleware). It is safe for concurrent use.
type Middleware struct {
	consumer *dedupe.Consumer[*message.Message]
	inbox    *dedupe.Inbox
	cfg      Config
	obs      dedupe.Observer
}

// call is one handling's inner handler and what it produced.
type call struct {
	h        message.HandlerFunc
	produced []*message.Message
}

// callKey holds the *call of a handling in its context.
type callKey struct{}

// New returns a Middleware that claims messages' keys in inbox. TTx is the
// transaction type of the inbox's driver, which handlers find with Tx:
// pgx.Tx for an inbox over a pgx pool, *sql.Tx for an inbox over dedupe.SQL;
// the other is refused with a *dedupe.ConfigError.
func New[TTx any](inbox *dedupe.Inbox, cfg Config) (*Middleware, error) {
	if inbox == nil {
		return nil, &dedupe.ConfigError{Field: "inbox", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults(inbox)
	if err != nil {
		return nil, err
	}
	m := &Middleware{inbox: inbox, cfg: c, obs: inbox.Config().Observer}
	keyFn := c.Key
	m.consumer, err = dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[*message.Message]{
		Scope: c.Scope,
		Key: func(msg *message.Message) (string, error) {
			id, err := keyFn(msg)
			if err != nil {
				return "", &KeyError{UUID: msg.UUID, Err: err}
			}
			return id, nil
		},
		Fingerprint: c.Fingerprint,
		IsoLevel:    c.IsoLevel,
		LockTimeout: c.LockTimeout,
		MaxAttempts: c.MaxAttempts,
		Describe:    m.describe,
	}, func(ctx context.Context, tx TTx, msg *message.Message) error { return m.run(ctx, tx, msg) })
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Scope returns the scope the middleware claims keys in.
func (m *Middleware) Scope() string { return m.cfg.Scope }

// Handler is the message.HandlerMiddleware: it wraps h so that each message
// is handled inside dedupe's transaction (see the package documentation).
func (m *Middleware) Handler(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return m.handle(h, msg)
	}
}

// run is the dedupe handler: it runs the handling's Watermill handler with
// the transaction in the message's context, and writes what it produced to
// the outbox when one is configured.
func (m *Middleware) run(ctx context.Context, tx any, msg *message.Message) error {
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return dedupe.Permanent(errors.New("dedupewatermill: handler run outside the middleware"))
	}
	orig := msg.Context()
	msg.SetContext(context.WithValue(ctx, txKey{}, tx))
	out, err := c.h(msg)
	msg.SetContext(orig)
	if err != nil {
		return err
	}
	if m.cfg.Outbox != nil && len(out) > 0 {
		q, err := querier(tx)
		if err != nil {
			return err
		}
		topic := m.cfg.OutboxTopic
		if topic == "" {
			topic = message.PublishTopicFromCtx(orig)
		}
		for _, p := range out {
			if _, err := m.cfg.Outbox.Enqueue(ctx, q, outboxMessage(topic, p)); err != nil {
				return fmt.Errorf("dedupewatermill: write produced message %s to the outbox: %w", p.UUID, err)
			}
		}
		out = nil
	}
	c.produced = out
	return nil
}

// handle handles one message and maps the outcome to what the router does.
func (m *Middleware) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	key, err := m.consumer.KeyOf(msg)
	if err != nil {
		return nil, m.refuse(ctx, msg, err)
	}
	c := &call{h: h}
	outcome, err := m.consumer.HandleKey(context.WithValue(ctx, callKey{}, c), key, msg)
	switch {
	case err == nil && outcome == dedupe.OutcomeClaimed:
		return c.produced, nil
	case err == nil:
		return nil, nil // a duplicate
	case outcome == dedupe.OutcomePoisoned:
		return nil, m.poison(ctx, msg, key, err)
	case outcome == dedupe.OutcomeConflict:
		return nil, m.refuse(ctx, msg, err)
	}
	m.event(ctx, dedupe.EventRetried, msg, key, err)
	return nil, err
}

// refuse records RefusedKey failed (cause: why the message can never be
// processed), then treats the message as poison. A database failure is
// returned, so the router nacks and the message comes back.
func (m *Middleware) refuse(ctx context.Context, msg *message.Message, cause error) error {
	key := dedupe.Key{Scope: m.cfg.Scope, ID: RefusedKey(msg)}
	m.event(ctx, dedupe.EventRefused, msg, key, cause)
	if _, _, err := m.inbox.RecordFailure(ctx, key, dedupe.Permanent(cause)); err != nil {
		err = fmt.Errorf("dedupewatermill: record refused message %s: %w", msg.UUID, err)
		m.event(ctx, dedupe.EventRetried, msg, key, err)
		return errors.Join(cause, err)
	}
	return m.poison(ctx, msg, key, cause)
}

// poison ends a message whose key is recorded failed: nil (ack), or with
// Config.ReturnPoison an error matching ErrPoison.
func (m *Middleware) poison(ctx context.Context, msg *message.Message, key dedupe.Key, cause error) error {
	m.event(ctx, dedupe.EventTerminated, msg, key, cause)
	if m.cfg.ReturnPoison {
		return fmt.Errorf("%w: %w", ErrPoison, cause)
	}
	return nil
}

// event logs what the middleware did with msg beyond its handling and tells
// the inbox's Observer.
func (m *Middleware) event(ctx context.Context, name string, msg *message.Message, key dedupe.Key, err error) {
	level := slog.LevelWarn
	if name == dedupe.EventTerminated {
		level = slog.LevelError
	}
	if name != dedupe.EventRefused && m.cfg.Logger.Enabled(ctx, level) {
		m.cfg.Logger.LogAttrs(ctx, level, "dedupewatermill: message "+name,
			slog.String("scope", m.cfg.Scope), slog.String("key", key.ID), slog.String("uuid", msg.UUID), slog.Any("err", err))
	}
	if m.obs != nil {
		m.obs.TransportEvent(ctx, dedupe.TransportEvent{Name: name, Key: key, Message: m.describe(msg), Err: err, Count: 1})
	}
}

// describe returns what the inbox's Observer is told of a message: its
// UUID, the subscribed topic, the handler's name and the metadata.
func (m *Middleware) describe(msg *message.Message) dedupe.MessageInfo {
	ctx := msg.Context()
	return dedupe.MessageInfo{
		System: "watermill", Destination: message.SubscribeTopicFromCtx(ctx), ID: msg.UUID,
		Group: message.HandlerNameFromCtx(ctx), Partition: -1, Offset: -1,
		Headers: Metadata(msg.Metadata),
	}
}

// Metadata adapts a message's metadata to dedupe.Headers (the interface of
// OpenTelemetry's propagation.TextMapCarrier), for the trace context.
type Metadata message.Metadata

var _ dedupe.Headers = Metadata(nil)

// Get returns the value of key.
func (md Metadata) Get(key string) string { return md[key] }

// Set sets key to value.
func (md Metadata) Set(key, value string) { md[key] = value }

// Keys lists the keys.
func (md Metadata) Keys() []string {
	out := make([]string, 0, len(md))
	for k := range md {
		out = append(out, k)
	}
	return out
}
