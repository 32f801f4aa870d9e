package dedupeamqp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
)

// Runner consumes a RabbitMQ queue and processes each message exactly once
// per key through a dedupe inbox. Create it with New and call Run.
type Runner struct {
	url      string
	queue    string
	id       string // distinguishes the consumer tags of runners
	consumer *dedupe.Consumer[amqp.Delivery]
	inbox    *dedupe.Inbox
	cfg      Config
	obs      dedupe.Observer
	describe func(amqp.Delivery) dedupe.MessageInfo
	sessions atomic.Int64
	held     holds
	running  atomic.Bool
}

// New returns a Runner that consumes queue on the broker at url (an
// amqp:// or amqps:// URI) and runs h for each new message, inside the
// transaction that claims its key. h receives the inbox driver's
// transaction: pgx.Tx for an inbox over a pgx pool, *sql.Tx for an inbox
// over dedupe.SQL; a handler of the other type is refused with a
// *dedupe.ConfigError. The delivery h receives cannot be acknowledged: the
// runner settles it. New does not connect; Run does.
func New[TTx any](inbox *dedupe.Inbox, url, queue string, cfg Config, h dedupe.TxHandlerFunc[TTx, amqp.Delivery]) (*Runner, error) {
	switch {
	case inbox == nil:
		return nil, &dedupe.ConfigError{Field: "inbox", Reason: "must not be nil"}
	case h == nil:
		return nil, &dedupe.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, &dedupe.ConfigError{Field: "url", Reason: err.Error()}
	}
	c, err := cfg.withDefaults(inbox, queue)
	if err != nil {
		return nil, err
	}
	keyFn := c.Key
	desc := describe(queue, c.Scope)
	dc, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[amqp.Delivery]{
		Scope: c.Scope,
		Key: func(d amqp.Delivery) (string, error) {
			id, err := keyFn(d)
			if err != nil {
				return "", &KeyError{Queue: queue, Err: err}
			}
			return id, nil
		},
		Fingerprint: c.Fingerprint,
		IsoLevel:    c.IsoLevel,
		LockTimeout: c.LockTimeout,
		MaxAttempts: c.MaxAttempts,
		Describe:    desc,
	}, lastDeliveryHandler(h, c.DeliveryLimit))
	if err != nil {
		return nil, err
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	return &Runner{url: url, queue: queue, id: hex.EncodeToString(id[:]), consumer: dc, inbox: inbox, cfg: c,
		obs: inbox.Config().Observer, describe: desc}, nil
}

// Scope returns the scope the runner claims keys in.
func (r *Runner) Scope() string { return r.cfg.Scope }

// Queue returns the queue the runner consumes.
func (r *Runner) Queue() string { return r.queue }

// Config returns the runner's configuration with defaults filled in.
func (r *Runner) Config() Config { return r.cfg }

// ErrRunning is returned by Run when the Runner is already running.
var ErrRunning = errors.New("dedupeamqp: runner already running")

// Run consumes and handles messages with Config.Workers workers until ctx
// is cancelled, connecting again (with Config.Reconnect) whenever the
// connection or channel closes. Then it cancels its consumer, hands back
// (basic.nack requeue) the deliveries it had not started and the ones held
// for a retry's delay, lets in-flight handlers finish within
// Config.DrainTimeout (after which they are cancelled and rolled back, and
// their deliveries handed back), closes its connection and returns nil.
//
// A delivery at the last delivery the queue allows (Config.DeliveryLimit) is
// never handed back: it is handled, or recorded as failed and dead-lettered
// (see the package documentation); Run does not return while it holds one
// it could do neither with.
//
// Run returns an error matching ErrQueueGone when the broker cancelled the
// consumer and the queue no longer exists.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	r.held.reset()

	// Handlers run on a context that outlives the stop by DrainTimeout, so
	// that a shutdown lets in-flight transactions commit rather than roll
	// back.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var (
		mu    sync.Mutex
		timer *time.Timer
	)
	stopAfter := context.AfterFunc(ctx, func() {
		mu.Lock()
		timer = time.AfterFunc(r.cfg.DrainTimeout, cancelWork)
		mu.Unlock()
		r.held.releaseAll() // hand back at once what waits for a retry
	})
	defer func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}()

	queue := make(chan *delivery)
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Go(func() {
			for d := range queue {
				r.handle(work, ctx.Done(), d)
			}
		})
	}
	last, err := r.consume(ctx, queue)
	close(queue)
	wg.Wait()
	r.held.releaseAll()
	r.held.wait()
	if last != nil {
		last.close()
	}
	return err
}

// consume connects, consumes and feeds deliveries to queue until ctx is
// done (it returns the live session, for the workers to settle their
// deliveries on, and nil) or the queue is gone.
func (r *Runner) consume(ctx context.Context, queue chan<- *delivery) (*session, error) {
	for failures := 0; ; {
		s, err := r.open(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			failures++
			r.cfg.Logger.WarnContext(ctx, "dedupeamqp: connect", "queue", r.queue, "attempt", failures, "err", err)
			if gone := queueGone(err); gone != nil {
				return nil, gone
			}
			sleep(ctx, nil, r.cfg.Reconnect.Delay(failures))
			continue
		}
		err = r.serve(ctx, s, queue)
		if ctx.Err() != nil {
			return s, nil
		}
		s.close()
		if errors.Is(err, ErrQueueGone) {
			return nil, err
		}
		failures = 1
		r.cfg.Logger.WarnContext(ctx, "dedupeamqp: consumer stopped; connecting again", "queue", r.queue, "err", err)
		sleep(ctx, nil, r.cfg.Reconnect.Delay(failures))
	}
}

// serve feeds s's deliveries to queue until ctx is done (then it cancels the
// consumer and hands back what the broker had already sent, and returns nil)
// or s ends (its channel died, or the broker cancelled the consumer).
func (r *Runner) serve(ctx context.Context, s *session, queue chan<- *delivery) error {
	for {
		select {
		case <-ctx.Done():
			r.stopConsuming(ctx, s)
			return nil
		case <-s.dead:
			return fmt.Errorf("channel closed: %w", s.err)
		case <-s.cancelled:
			return r.cancelled(ctx, s)
		case m, ok := <-s.deliveries:
			if !ok {
				// Closed by the channel's death or a cancel; say which.
				select {
				case <-s.dead:
					return fmt.Errorf("channel closed: %w", s.err)
				case <-s.cancelled:
					return r.cancelled(ctx, s)
				case <-time.After(time.Second):
					return errors.New("deliveries ended")
				}
			}
			d := r.newDelivery(s, m)
			dead := s.dead
			if d.last {
				// The broker drops it with a dead channel: never let go of
				// it unhandled (handle keeps going at the last delivery).
				dead = nil
			}
			select {
			case queue <- d:
			case <-dead:
			case <-ctx.Done():
				r.handBack(ctx, d)
			}
		}
	}
}

// stopConsuming cancels s's consumer and hands back the deliveries the
// broker sent before the cancel took effect.
func (r *Runner) stopConsuming(ctx context.Context, s *session) {
	if err := s.ch.Cancel(s.tag, false); err != nil {
		return // the channel is closing: the broker requeues them all
	}
	for m := range s.deliveries {
		r.handBack(ctx, r.newDelivery(s, m))
	}
}

// cancelled handles the broker's cancel of s's consumer: ErrQueueGone when
// the queue was deleted, else an error after which the runner consumes
// again.
func (r *Runner) cancelled(ctx context.Context, s *session) error {
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("consumer cancelled by the broker: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDeclarePassive(r.queue, false, false, false, false, nil); err != nil {
		if gone := queueGone(err); gone != nil {
			return gone
		}
		return fmt.Errorf("consumer cancelled by the broker: %w", err)
	}
	return errors.New("consumer cancelled by the broker")
}

// queueGone returns an error matching ErrQueueGone when err is the broker's
// 404 NOT_FOUND for the queue, else nil.
func queueGone(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return fmt.Errorf("%w: %w", ErrQueueGone, err)
	}
	return nil
}

// sleep waits d, or less when ctx is done or wake is closed.
func sleep(ctx context.Context, wake <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-wake:
	}
}

// isClosed reports whether ch is closed (a nil channel never is).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
