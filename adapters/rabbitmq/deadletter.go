package dedupeamqp

import (
	"context"
	"errors"
	"maps"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
)

// Headers of a copy published to Config.DeadLetterExchange, besides the
// original message's own headers and properties.
const (
	// DeadLetterReasonHeader says why the runner gave up on the message.
	DeadLetterReasonHeader = "Dedupe-Reason"
	// DeadLetterQueueHeader is the queue it was consumed from.
	DeadLetterQueueHeader = "Dedupe-Queue"
	// DeadLetterExchangeHeader and DeadLetterRoutingKeyHeader are the
	// exchange and routing key it was originally published with.
	DeadLetterExchangeHeader   = "Dedupe-Exchange"
	DeadLetterRoutingKeyHeader = "Dedupe-Routing-Key"
	// DeadLetterKeyHeader is the inbox key it is recorded under as failed
	// (its dedup key, or its RefusedKey).
	DeadLetterKeyHeader = "Dedupe-Key"
	// DeadLetterDeliveriesHeader is its delivery number (see
	// dedupe.MessageInfo.Delivery).
	DeadLetterDeliveriesHeader = "Dedupe-Deliveries"
)

// maxReason bounds the reason in DeadLetterReasonHeader.
const maxReason = 500

// deadLetter ends a delivery whose key (or RefusedKey) is recorded as
// failed in the inbox because of cause. With Config.DeadLetterExchange a
// copy is published there with confirms and then the delivery is acked; a
// copy that fails is retried: the delivery is requeued after a backoff (at
// its last delivery, held and retried in place). Without it the delivery is
// rejected without requeue, to the queue's own dead-letter exchange.
// stopping is nil outside a run.
func (r *Runner) deadLetter(ctx context.Context, stopping <-chan struct{}, d *delivery, cause error) {
	if r.cfg.DeadLetterExchange == "" {
		r.reject(ctx, d, cause)
		return
	}
	for try := 1; ; try++ {
		err := r.publishCopy(context.WithoutCancel(ctx), d, cause)
		if err == nil {
			r.event(ctx, dedupe.EventDeadLettered, d, cause, 0)
			r.ack(ctx, d)
			r.event(ctx, dedupe.EventTerminated, d, errors.Join(cause, ErrDeadLettered), 0)
			return
		}
		r.event(ctx, dedupe.EventDeadLetterFailed, d, err, 0)
		switch {
		case d.sess.isDead():
			if d.last {
				r.lostAtLastDelivery(ctx, d, errors.Join(cause, err))
			}
			return
		case ctx.Err() != nil:
			// Past DrainTimeout: it is recorded as failed; the queue's own
			// dead-letter exchange is the last resort.
			r.reject(ctx, d, errors.Join(cause, err))
			return
		case !d.last && !isClosed(stopping):
			r.requeueLater(ctx, d, errors.Join(cause, err), r.cfg.Backoff(max(d.num, 1)))
			return
		case !d.last:
			r.release(ctx, d, errors.Join(cause, err))
			return
		}
		sleep(ctx, d.sess.dead, r.cfg.Backoff(try))
	}
}

// reject rejects a delivery without requeue, which routes it to the
// queue's x-dead-letter-exchange (a queue without one drops it; it is
// recorded failed in the inbox before).
func (r *Runner) reject(ctx context.Context, d *delivery, cause error) {
	if err := d.sess.reject(d.tag); err != nil {
		r.event(ctx, dedupe.EventAckFailed, d, err, 0)
		return
	}
	r.event(ctx, dedupe.EventTerminated, d, cause, 0)
}

// refuse gives up on a delivery that can never be processed
// (dedupe.EventRefused): it has no usable key, or its key was used with
// another payload (cause). It first records RefusedKey failed in the inbox,
// so that the message stays visible there whatever becomes of the copy,
// then dead-letters it. A database failure is retried in place; a stop
// hands the delivery back.
func (r *Runner) refuse(ctx context.Context, stopping <-chan struct{}, d *delivery, cause error) {
	key := dedupe.Key{Scope: r.cfg.Scope, ID: RefusedKey(r.queue, d.key.ID, d.msg)}
	d.key = key
	r.event(ctx, dedupe.EventRefused, d, cause, 0)
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout)
		_, _, err := r.inbox.RecordFailure(rctx, key, dedupe.Permanent(cause))
		cancel()
		if err == nil {
			// Recorded now, or by an earlier delivery of the same message.
			r.deadLetter(ctx, stopping, d, cause)
			return
		}
		r.cfg.Logger.WarnContext(ctx, "dedupeamqp: recording a refused message failed, retrying",
			"queue", r.queue, "key", key.ID, "err", err)
		switch {
		case d.sess.isDead():
			if d.last {
				r.lostAtLastDelivery(ctx, d, errors.Join(cause, err))
			}
			return
		case d.last && r.cfg.DeadLetterExchange != "":
			r.settle(ctx, d, cause, false)
			return
		case !d.last && (isClosed(stopping) || ctx.Err() != nil):
			r.release(ctx, d, errors.Join(cause, err))
			return
		}
		sleep(ctx, d.sess.dead, r.cfg.Backoff(try))
	}
}

// publishCopy publishes a copy of d to Config.DeadLetterExchange on its
// session's confirm channel and waits for the broker's confirm.
func (r *Runner) publishCopy(ctx context.Context, d *delivery, cause error) error {
	c, err := d.sess.confirmer()
	if err != nil {
		return err
	}
	m := d.msg
	h := amqp.Table{}
	maps.Copy(h, m.Headers)
	reason := "dedupe: gave up"
	if cause != nil {
		reason = cause.Error()
	}
	if len(reason) > maxReason {
		reason = strings.ToValidUTF8(reason[:maxReason], "")
	}
	h[DeadLetterReasonHeader] = reason
	h[DeadLetterQueueHeader] = r.queue
	h[DeadLetterExchangeHeader] = m.Exchange
	h[DeadLetterRoutingKeyHeader] = m.RoutingKey
	h[DeadLetterDeliveriesHeader] = int64(d.num)
	if d.key.ID != "" {
		h[DeadLetterKeyHeader] = d.key.ID
	}
	pub := amqp.Publishing{
		Headers: h, ContentType: m.ContentType, ContentEncoding: m.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: m.Priority, CorrelationId: m.CorrelationId,
		ReplyTo: m.ReplyTo, MessageId: m.MessageId, Timestamp: m.Timestamp, Type: m.Type,
		AppId: m.AppId, Body: m.Body,
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	return c.publish(pctx, []outgoing{{exchange: r.cfg.DeadLetterExchange, key: r.cfg.DeadLetterRoutingKey, msg: pub}})[0]
}
