package dedupenats

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// delivery is one delivered message as the runner handles it.
type delivery struct {
	msg jetstream.Msg
	key dedupe.Key // zero while unknown, or when it has none
	num uint64     // the JetStream delivery count, from 1 (0 when unknown)
}

func newDelivery(msg jetstream.Msg) delivery {
	d := delivery{msg: msg}
	if meta, err := msg.Metadata(); err == nil {
		d.num = meta.NumDelivered
	}
	return d
}

// eventLevels is the level each event is logged at; the others are not
// logged (an event that always comes with a logged one, or, for a refusal,
// the termination or retry that follows says it).
var eventLevels = map[string]slog.Level{
	dedupe.EventAckFailed:        slog.LevelWarn,
	dedupe.EventRetried:          slog.LevelWarn,
	dedupe.EventReleased:         slog.LevelDebug,
	dedupe.EventDeadLetterFailed: slog.LevelWarn,
	dedupe.EventTerminated:       slog.LevelError,
}

// event logs what the runner did with d beyond its handling (name, one of
// the dedupe.Event constants), and tells the inbox's Observer. Without an
// Observer, and with the level not enabled, it costs nothing.
func (r *Runner) event(ctx context.Context, name string, d *delivery, err error, delay time.Duration) {
	if level, ok := eventLevels[name]; ok && r.cfg.Logger.Enabled(ctx, level) {
		attrs := []slog.Attr{
			slog.String("scope", r.cfg.Scope),
			slog.String("key", d.key.ID),
			slog.String("subject", d.msg.Subject()),
			slog.Uint64("delivery", d.num),
		}
		if delay > 0 {
			attrs = append(attrs, slog.Duration("delay", delay))
		}
		if err != nil {
			attrs = append(attrs, slog.Any("err", err))
		}
		r.cfg.Logger.LogAttrs(ctx, level, "dedupenats: message "+name, attrs...)
	}
	if r.obs == nil {
		return
	}
	r.obs.TransportEvent(ctx, dedupe.TransportEvent{
		Name: name, Key: d.key, Message: r.describe(d.msg), Err: err, Delay: delay, Count: 1,
	})
}
