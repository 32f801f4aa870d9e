package dedupenats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// Runner consumes a JetStream consumer with exactly-once effects. Build it
// with New; it is safe for concurrent use, and Run may be called again after
// it returned.
type Runner struct {
	js       jetstream.Consumer
	consumer *dedupe.Consumer[jetstream.Msg]
	batch    *dedupe.BatchConsumer[jetstream.Msg] // batch mode (Config.BatchSize > 1), else nil
	inbox    *dedupe.Inbox
	cfg      Config
	beat     *heartbeat
	obs      dedupe.Observer                        // the inbox's, told of transport events
	describe func(jetstream.Msg) dedupe.MessageInfo // what obs is told of a message
}

// New returns a Runner that handles the messages of cons with h, claiming
// their keys in inbox; the zero Config is the defaults. The handler writes
// its effects through the transaction it is given; they commit together with
// the claim, and only then is the message acknowledged.
//
// h receives the transaction of the inbox's driver: a pgx.Tx for an inbox
// over a pgx pool, a *sql.Tx for an inbox over dedupe.SQL. A handler of the
// other type is refused with a *dedupe.ConfigError.
func New[TTx any](inbox *dedupe.Inbox, cons jetstream.Consumer, cfg Config, h dedupe.TxHandlerFunc[TTx, jetstream.Msg]) (*Runner, error) {
	switch {
	case inbox == nil:
		return nil, &dedupe.ConfigError{Field: "inbox", Reason: "must not be nil"}
	case cons == nil:
		return nil, &dedupe.ConfigError{Field: "consumer", Reason: "must not be nil"}
	case h == nil:
		return nil, &dedupe.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults(inbox, cons.CachedInfo())
	if err != nil {
		return nil, err
	}
	keyFn := c.Key
	desc := describe(consumerName(cons))
	cc := dedupe.ConsumerConfig[jetstream.Msg]{
		Scope: c.Scope,
		Key: func(msg jetstream.Msg) (string, error) {
			id, err := keyFn(msg)
			if err != nil {
				return "", &KeyError{Subject: msg.Subject(), Err: err}
			}
			return id, nil
		},
		Fingerprint: c.Fingerprint,
		IsoLevel:    c.IsoLevel,
		LockTimeout: c.LockTimeout,
		MaxAttempts: c.MaxAttempts,
		Describe:    desc,
	}
	lh := lastDeliveryHandler(h, c.maxDeliver)
	dc, err := dedupe.NewConsumer(inbox, cc, lh)
	if err != nil {
		return nil, err
	}
	var bc *dedupe.BatchConsumer[jetstream.Msg]
	if c.BatchSize > 1 {
		if bc, err = dedupe.NewBatchConsumer(inbox, cc, lh); err != nil {
			return nil, err
		}
	}
	return &Runner{js: cons, consumer: dc, batch: bc, inbox: inbox, cfg: c, beat: newHeartbeat(c.Heartbeat, c.Logger),
		obs: inbox.Config().Observer, describe: desc}, nil
}

// Scope returns the scope the runner claims keys in.
func (r *Runner) Scope() string { return r.cfg.Scope }

// Config returns the runner's configuration with defaults filled in.
func (r *Runner) Config() Config { return r.cfg }

// Run pulls and handles messages with Config.Workers workers until ctx is
// cancelled. Then it stops asking for messages, waits for the open pull
// request to end (at most Config.PullExpiry) so that no message the server
// sent goes unseen, hands the messages it had buffered back (Nak) for
// immediate redelivery, lets in-flight handlers finish within
// Config.DrainTimeout (after which they are cancelled and rolled back, and
// their messages handed back), and returns nil.
//
// A message at the last delivery the consumer allows (MaxDeliver) is never
// handed back, since JetStream would not deliver it again: a buffered one is
// handled, and one whose handler was cancelled is recorded as failed in the
// inbox or, failing that, copied to Config.DeadLetterSubject, before it is
// terminated. Run does not return while it holds such a message it could do
// neither with; it keeps the message alive and keeps trying, logging each
// failure at error level.
//
// Run returns an error wrapping ErrIteratorClosed when it cannot pull any
// more for another reason: the connection was closed or the consumer
// deleted.
func (r *Runner) Run(ctx context.Context) error {
	// Stopping begins when ctx is cancelled or pulling fails for good.
	stop, stopNow := context.WithCancel(ctx)
	defer stopNow()
	// Handlers run on a context that outlives the stop by DrainTimeout, so
	// that a shutdown lets in-flight transactions commit rather than roll
	// back.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var (
		mu    sync.Mutex
		timer *time.Timer
	)
	stopAfter := context.AfterFunc(stop, func() {
		mu.Lock()
		timer = time.AfterFunc(r.cfg.DrainTimeout, cancelWork)
		mu.Unlock()
	})
	defer func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}()

	// Every message pulled is held by the heartbeat, so the queue never
	// holds more than the runner's capacity and a send never blocks.
	queue := make(chan jetstream.Msg, r.capacity())
	pulled := make(chan struct{})
	p := phase{stopping: stop.Done(), pulled: pulled}
	work1 := r.work
	if r.batch != nil {
		work1 = r.workBatches
	}
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Go(func() { work1(work, p, queue) })
	}
	err := r.pull(ctx, queue)
	stopNow()
	close(pulled)
	close(queue)
	work1(work, p, queue) // help hand the buffer back
	wg.Wait()
	return err
}

// work handles the messages of queue until it is closed and empty. Once the
// run stops, it hands them back instead (after the last pull request
// ended), except those at their last delivery, which it still handles.
func (r *Runner) work(ctx context.Context, p phase, queue <-chan jetstream.Msg) {
	for msg := range queue {
		if isClosed(p.stopping) && !r.atLastDelivery(msg) {
			r.handBack(ctx, p, msg)
			continue
		}
		r.handle(ctx, p, msg)
	}
}

// capacity is how many messages the runner holds at most: what its workers
// handle (Workers, or Workers batches of BatchSize) and MaxPending more.
func (r *Runner) capacity() int {
	return r.cfg.Workers*r.cfg.BatchSize + r.cfg.MaxPending
}

// pull fetches messages into queue until ctx is cancelled (then it returns
// nil once the open pull request has ended) or pulling fails for good.
//
// It sends one pull request at a time, for as many messages as the runner
// has room for (its capacity, less what it holds) and only once half of
// MaxPending is free, so a request serves many messages. Each message is
// held by the heartbeat from the moment it arrives.
func (r *Runner) pull(ctx context.Context, queue chan<- jetstream.Msg) error {
	capacity := r.capacity()
	low := max(1, (r.cfg.MaxPending+1)/2)
	for failures := 0; ; {
		free, ok := r.room(ctx, capacity, low)
		if !ok {
			return nil
		}
		if r.cfg.maxBatch > 0 {
			free = min(free, r.cfg.maxBatch)
		}
		batch, err := r.js.Fetch(free, jetstream.FetchMaxWait(r.cfg.PullExpiry))
		if err == nil {
			// Read to the end even when stopping: the server may still send
			// messages for this request, and each must be seen (the workers
			// hand them back once it ended).
			for msg := range batch.Messages() {
				r.beat.hold(msg)
				queue <- msg
			}
			err = batch.Error()
		}
		if err == nil || ctx.Err() != nil {
			failures = 0
			continue
		}
		if ferr := r.final(ctx, err); ferr != nil {
			return ferr
		}
		failures++
		r.cfg.Logger.WarnContext(ctx, "dedupenats: pull", "scope", r.cfg.Scope, "err", err)
		t := time.NewTimer(min(time.Duration(failures)*100*time.Millisecond, 5*time.Second))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// room waits until at least low of capacity is free and returns how much
// is, or false when ctx is done.
func (r *Runner) room(ctx context.Context, capacity, low int) (int, bool) {
	for {
		if ctx.Err() != nil {
			return 0, false
		}
		if free := capacity - r.beat.count(); free >= low {
			return free, true
		}
		t := time.NewTimer(time.Second) // in case another Run took the signal
		select {
		case <-r.beat.freed:
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// final returns the error Run ends with when err means that no pull can
// succeed any more, else nil.
func (r *Runner) final(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrConsumerDeleted):
		return fmt.Errorf("%w: %w", ErrIteratorClosed, err)
	case errors.Is(err, nats.ErrNoResponders):
		// Nobody answers pull requests: is the consumer gone?
		ictx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
		defer cancel()
		if _, ierr := r.js.Info(ictx); errors.Is(ierr, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("%w: %w", ErrIteratorClosed, ierr)
		}
	}
	return nil
}

// atLastDelivery reports whether msg is at the last delivery the consumer
// allows: JetStream will not deliver it again, whatever the runner does.
func (r *Runner) atLastDelivery(msg jetstream.Msg) bool {
	if r.cfg.maxDeliver <= 0 {
		return false
	}
	meta, err := msg.Metadata()
	return err == nil && meta.NumDelivered >= uint64(r.cfg.maxDeliver)
}

// handBack releases a message the runner did not handle because it is
// stopping (dedupe.EventReleased).
func (r *Runner) handBack(ctx context.Context, p phase, msg jetstream.Msg) {
	d := newDelivery(msg)
	if key, err := r.consumer.KeyOf(msg); err == nil {
		d.key = key
	}
	r.release(ctx, p, &d, nil)
}
