package dedupenats

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// Open creates the durable pull consumer cc on stream, or updates it, and
// returns a Runner for it: New for callers who describe the consumer rather
// than hold one. cc.Durable is required (an ephemeral consumer forgets its
// deliveries when it goes, which defeats redelivery) and cc.AckPolicy must
// be left explicit (its zero value). h receives the inbox driver's
// transaction, as for New: pgx.Tx, or *sql.Tx for an inbox over dedupe.SQL.
func Open[TTx any](ctx context.Context, inbox *dedupe.Inbox, js jetstream.JetStream, stream string,
	cc jetstream.ConsumerConfig, cfg Config, h dedupe.TxHandlerFunc[TTx, jetstream.Msg]) (*Runner, error) {
	switch {
	case js == nil:
		return nil, &dedupe.ConfigError{Field: "js", Reason: "must not be nil"}
	case cc.Durable == "":
		return nil, &dedupe.ConfigError{Field: "ConsumerConfig.Durable", Reason: "is required"}
	case cc.AckPolicy != jetstream.AckExplicitPolicy:
		return nil, &dedupe.ConfigError{Field: "ConsumerConfig.AckPolicy", Reason: "must be AckExplicitPolicy"}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, cc)
	if err != nil {
		return nil, fmt.Errorf("dedupenats: consumer %s on stream %s: %w", cc.Durable, stream, err)
	}
	if cfg.DeadLetterSubject != "" && cfg.DeadLetterJS == nil {
		cfg.DeadLetterJS = js
	}
	return New(inbox, cons, cfg, h)
}
