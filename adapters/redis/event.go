package deduperedis

import (
	"context"
	"log/slog"
	"time"

	"github.com/exactlyonce/dedupe"
)

// eventLevels is the level each event is logged at; the others are not
// logged.
var eventLevels = map[string]slog.Level{
	dedupe.EventAckFailed:        slog.LevelWarn,
	dedupe.EventRetried:          slog.LevelWarn,
	dedupe.EventReleased:         slog.LevelDebug,
	dedupe.EventDeadLetterFailed: slog.LevelWarn,
	dedupe.EventTerminated:       slog.LevelError,
}

// event logs what the runner did with m beyond its handling (name, one of
// the dedupe.Event constants), and tells the inbox's Observer. Without an
// Observer, and with the level not enabled, it costs nothing.
func (r *Runner) event(ctx context.Context, name string, m *Message, key dedupe.Key, err error, delay time.Duration) {
	if level, ok := eventLevels[name]; ok && r.cfg.Logger.Enabled(ctx, level) {
		attrs := []slog.Attr{
			slog.String("scope", r.cfg.Scope),
			slog.String("key", key.ID),
			slog.String("stream", m.Stream),
			slog.String("entry", m.ID),
			slog.Int64("delivery", m.Deliveries),
		}
		if delay > 0 {
			attrs = append(attrs, slog.Duration("delay", delay))
		}
		if err != nil {
			attrs = append(attrs, slog.Any("err", err))
		}
		r.cfg.Logger.LogAttrs(ctx, level, "deduperedis: entry "+name, attrs...)
	}
	if r.obs == nil {
		return
	}
	r.obs.TransportEvent(ctx, dedupe.TransportEvent{
		Name: name, Key: key, Message: r.describe(m), Err: err, Delay: delay, Count: 1,
	})
}
