package dedupeamqp

import (
	"context"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
)

// delivery is one delivery as the runner handles it.
type delivery struct {
	msg  amqp.Delivery // the handler's copy: its Acknowledger is nil
	tag  uint64        // the delivery tag on sess's channel
	sess *session      // the channel it came from
	key  dedupe.Key    // zero while unknown, or when it has none
	num  int           // the delivery's number, from 1 (see deliveryNumber)
	last bool          // the last delivery the queue allows
}

// newDelivery wraps d from sess's channel. The handler's copy has no
// Acknowledger: only the runner settles a delivery.
func (r *Runner) newDelivery(s *session, d amqp.Delivery) *delivery {
	dv := &delivery{tag: d.DeliveryTag, sess: s, num: deliveryNumber(d)}
	d.Acknowledger = nil
	dv.msg = d
	if r.cfg.DeliveryLimit > 0 {
		if n, ok := headerInt(d.Headers, deliveryCountHeader); ok && n >= int64(r.cfg.DeliveryLimit) {
			dv.last = true
		}
	}
	return dv
}

// eventLevels is the level each event is logged at; the others are not
// logged.
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
			slog.String("queue", r.queue),
			slog.Int("delivery", d.num),
		}
		if delay > 0 {
			attrs = append(attrs, slog.Duration("delay", delay))
		}
		if err != nil {
			attrs = append(attrs, slog.Any("err", err))
		}
		r.cfg.Logger.LogAttrs(ctx, level, "dedupeamqp: message "+name, attrs...)
	}
	if r.obs == nil {
		return
	}
	r.obs.TransportEvent(ctx, dedupe.TransportEvent{
		Name: name, Key: d.key, Message: r.describe(d.msg), Err: err, Delay: delay, Count: 1,
	})
}
