package dedupeamqp

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
)

// confirmer publishes on a channel in confirm mode with the mandatory flag
// and waits for each publish's confirm, so that a publish counts only once
// the broker took responsibility for it and routed it to a queue. Publishes
// are serialized.
type confirmer struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	mu      sync.Mutex
}

// returnsBuffer is the room for basic.returns waiting to be matched. The
// library's reader blocks while it is full, so publish drains it while it
// waits for confirms.
const returnsBuffer = 64

// confirmIDHeader carries the confirmer's own id of a publish, by which a
// basic.return is matched to it (the message_id belongs to the user).
const confirmIDHeader = "x-dedupe-publish-id"

var publishSeq atomic.Uint64

func openConfirmer(conn *amqp.Connection) (*confirmer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("confirm channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	c := &confirmer{ch: ch, returns: make(chan amqp.Return, returnsBuffer)}
	ch.NotifyReturn(c.returns)
	return c, nil
}

// outgoing is one publish of a batch.
type outgoing struct {
	exchange, key string
	msg           amqp.Publishing
}

// publish publishes msgs and returns each one's error: nil once the broker
// confirmed it, a *PublishError matching ErrUnroutable when the broker
// returned it (no queue took it), ErrNacked when it nacked it, or the
// channel's or ctx's error. msgs' headers get confirmIDHeader.
func (c *confirmer) publish(ctx context.Context, msgs []outgoing) []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	errs := make([]error, len(msgs))
	dcs := make([]*amqp.DeferredConfirmation, len(msgs))
	ids := make([]string, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if m.msg.Headers == nil {
			m.msg.Headers = amqp.Table{}
		}
		ids[i] = strconv.FormatUint(publishSeq.Add(1), 36)
		m.msg.Headers[confirmIDHeader] = ids[i]
		dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, m.exchange, m.key, true, false, m.msg)
		if err != nil {
			errs[i] = &PublishError{Exchange: m.exchange, RoutingKey: m.key, Err: err}
			continue
		}
		dcs[i] = dc
	}
	returned := map[string]amqp.Return{}
	returns := c.returns // nil once the library closed it (the channel closed)
	take := func(r amqp.Return, ok bool) {
		if !ok {
			returns = nil
			return
		}
		if id, ok := r.Headers[confirmIDHeader].(string); ok {
			returned[id] = r
		}
	}
	for i, dc := range dcs {
		if dc == nil {
			continue
		}
		m := &msgs[i]
	wait:
		for {
			select {
			case r, ok := <-returns:
				take(r, ok)
			case <-dc.Done():
				break wait
			case <-ctx.Done():
				errs[i] = &PublishError{Exchange: m.exchange, RoutingKey: m.key, Err: ctx.Err()}
				break wait
			}
		}
		if errs[i] != nil {
			continue
		}
		// A basic.return comes before the confirm of its publish, and the
		// library hands it over before it resolves the confirm.
		for drained := false; !drained && returns != nil; {
			select {
			case r, ok := <-returns:
				take(r, ok)
			default:
				drained = true
			}
		}
		switch r, ok := returned[ids[i]]; {
		case ok:
			errs[i] = &PublishError{Exchange: m.exchange, RoutingKey: m.key, ReplyCode: int(r.ReplyCode), ReplyText: r.ReplyText, Err: ErrUnroutable}
		case !dc.Acked():
			err := error(ErrNacked)
			if c.ch.IsClosed() {
				err = amqp.ErrClosed
			}
			errs[i] = &PublishError{Exchange: m.exchange, RoutingKey: m.key, Err: err}
		}
	}
	return errs
}

// close closes the confirmer's channel.
func (c *confirmer) close() { _ = c.ch.Close() }
