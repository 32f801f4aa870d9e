package dedupeamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one connection of a Runner, with the channel its consumer
// consumes on. Delivery tags belong to that channel: once it died (dead is
// closed), none of its deliveries is ever settled, since the broker has
// requeued them all.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	tag        string
	deliveries <-chan amqp.Delivery
	cancelled  chan string // the broker cancelled the consumer

	dead chan struct{} // closed once the channel or the connection closed
	err  error         // why, set before dead is closed (nil for our own close)

	pubMu sync.Mutex
	pub   *confirmer // opened on first use, for dead-letter copies
}

// open dials the broker, opens a channel with the runner's prefetch and
// consumes the queue with manual acks.
func (r *Runner) open(ctx context.Context) (*session, error) {
	conn, err := amqp.DialConfig(r.url, r.cfg.AMQP)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	s := &session{conn: conn, dead: make(chan struct{}), cancelled: make(chan string, 1)}
	fail := func(what string, err error) (*session, error) {
		_ = conn.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if ctx.Err() != nil {
		return fail("open", ctx.Err())
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	if s.ch, err = conn.Channel(); err != nil {
		return fail("channel", err)
	}
	chClosed := s.ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		var e *amqp.Error
		select {
		case e = <-connClosed:
		case e = <-chClosed:
		}
		if e != nil {
			s.err = e
		}
		close(s.dead)
	}()
	if err := s.ch.Qos(r.cfg.Prefetch, 0, false); err != nil {
		return fail("qos", err)
	}
	s.ch.NotifyCancel(s.cancelled)
	s.tag = r.cfg.ConsumerTag
	if s.tag == "" {
		s.tag = "dedupeamqp-" + r.cfg.Scope + "-" + r.id + "-" + fmt.Sprint(r.sessions.Add(1))
	}
	if s.deliveries, err = s.ch.Consume(r.queue, s.tag, false, false, false, false, nil); err != nil {
		return fail("consume "+r.queue, err)
	}
	return s, nil
}

// isDead reports whether the session's channel died.
func (s *session) isDead() bool { return isClosed(s.dead) }

// close closes the session's connection (and with it its channels: the
// broker requeues every delivery not settled).
func (s *session) close() {
	s.pubMu.Lock()
	s.pub = nil
	s.pubMu.Unlock()
	_ = s.conn.Close()
	<-s.dead
}

// ack, requeue and reject settle a delivery on its own channel, never on a
// dead one (ErrChannelClosed): its tag died with the channel.
func (s *session) ack(tag uint64) error {
	if s.isDead() {
		return ErrChannelClosed
	}
	return settleErr(s.ch.Ack(tag, false))
}

func (s *session) requeue(tag uint64) error {
	if s.isDead() {
		return ErrChannelClosed
	}
	return settleErr(s.ch.Nack(tag, false, true))
}

func (s *session) reject(tag uint64) error {
	if s.isDead() {
		return ErrChannelClosed
	}
	return settleErr(s.ch.Reject(tag, false))
}

// settleErr makes the error of an ack sent on a channel that closed
// meanwhile match ErrChannelClosed.
func settleErr(err error) error {
	if errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("%w: %w", ErrChannelClosed, err)
	}
	return err
}

// confirmer returns the session's confirm-mode channel for dead-letter
// copies, opening it when needed (again after it closed).
func (s *session) confirmer() (*confirmer, error) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	if s.pub != nil && !s.pub.ch.IsClosed() {
		return s.pub, nil
	}
	if s.isDead() {
		return nil, ErrChannelClosed
	}
	c, err := openConfirmer(s.conn)
	if err != nil {
		return nil, err
	}
	s.pub = c
	return c, nil
}
