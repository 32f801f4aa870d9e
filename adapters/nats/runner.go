package dedupenats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// Runner consumes a JetStream consumer with exactly-once effects. Build it
// with New; it is safe for concurrent use, and Run may be called again after
// it returned.
type Runner struct {
	js       jetstream.Consumer
	consumer *dedupe.Consumer[jetstream.Msg]
	cfg      Config

	// beforeAck, set by tests only, runs between the commit and the ack.
	beforeAck func(msg jetstream.Msg)
}

// New returns a Runner that handles the messages of cons with h, claiming
// their keys in inbox. cfg may be nil for the defaults. The handler writes
// its effects through the transaction it is given; they commit together with
// the claim, and only then is the message acknowledged.
func New(inbox *dedupe.Inbox, cons jetstream.Consumer, h dedupe.HandlerFunc[jetstream.Msg], cfg *Config) (*Runner, error) {
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
	dc, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[jetstream.Msg]{
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
	}, h)
	if err != nil {
		return nil, err
	}
	return &Runner{js: cons, consumer: dc, cfg: c}, nil
}

// Scope returns the scope the runner claims keys in.
func (r *Runner) Scope() string { return r.cfg.Scope }

// Config returns the runner's configuration with defaults filled in.
func (r *Runner) Config() Config { return r.cfg }

// Run pulls and handles messages with Config.Workers workers until ctx is
// cancelled, then stops fetching, hands buffered messages back (Nak) for
// immediate redelivery, lets in-flight handlers finish within
// Config.DrainTimeout (after which they are cancelled and rolled back), and
// returns nil. It returns an error wrapping ErrIteratorClosed when the
// message iterator closes for another reason (the connection was closed).
func (r *Runner) Run(ctx context.Context) error {
	it, err := r.js.Messages(jetstream.PullMaxMessages(r.cfg.MaxPending))
	if err != nil {
		return fmt.Errorf("dedupenats: start pulling: %w", err)
	}
	defer it.Stop()

	// Handlers run on a context that outlives ctx by DrainTimeout, so that a
	// shutdown lets in-flight transactions commit rather than roll back.
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
	})
	defer func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}()

	msgs := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Go(func() {
			for msg := range msgs {
				r.Handle(work, msg)
			}
		})
	}

	runErr := r.pull(ctx, it, msgs)
	close(msgs)
	r.handBack(it)
	wg.Wait()
	return runErr
}

// pull feeds msgs from it until ctx is cancelled or it closes.
func (r *Runner) pull(ctx context.Context, it jetstream.MessagesContext, msgs chan<- jetstream.Msg) error {
	var last error // the error that preceded a close (consumer deleted, ...)
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			if msg != nil {
				r.release(msg)
			}
			return nil
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return fmt.Errorf("%w: %w", ErrIteratorClosed, errors.Join(err, last))
			}
			// Missing heartbeats and the like: the iterator recovers; a
			// terminal error closes it and the next call says so.
			last = err
			r.cfg.Logger.WarnContext(ctx, "dedupenats: pull", "scope", r.cfg.Scope, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case msgs <- msg:
		case <-ctx.Done():
			r.release(msg)
			return nil
		}
	}
}

// handBack naks the messages the iterator had buffered, so that they are
// redelivered at once (to another runner) instead of after AckWait.
func (r *Runner) handBack(it jetstream.MessagesContext) {
	it.Drain()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		msg, err := it.Next(jetstream.NextMaxWait(100 * time.Millisecond))
		if err != nil {
			return
		}
		r.release(msg)
	}
}

// release hands a message that was not handled back for redelivery.
func (r *Runner) release(msg jetstream.Msg) {
	if err := msg.Nak(); err != nil {
		r.cfg.Logger.Debug("dedupenats: nak on shutdown", "subject", msg.Subject(), "err", err)
	}
}

// Handle processes one message: claim, handler and commit in one
// transaction, then the broker action its outcome calls for (see the package
// documentation). Run calls it for every message; call it yourself only when
// you fetch messages yourself. The Event it returns was also passed to
// Config.Metrics.
func (r *Runner) Handle(ctx context.Context, msg jetstream.Msg) Event {
	ev := Event{Subject: msg.Subject()}
	if meta, err := msg.Metadata(); err == nil {
		ev.Delivery = meta.NumDelivered
	}
	key, kerr := r.consumer.KeyOf(msg)
	ev.Key = key
	if kerr != nil {
		ev.Err = kerr
		r.term(msg, &ev)
		r.cfg.Metrics.Observe(ctx, ev)
		return ev
	}

	stopBeat := r.heartbeat(msg)
	start := time.Now()
	outcome, err := r.consumer.HandleKey(ctx, key, msg)
	ev.Latency = time.Since(start)
	stopBeat()
	ev.Outcome, ev.Err = outcome, err

	switch {
	case err == nil:
		ev.Kind = KindProcessed
		if outcome == dedupe.OutcomeDuplicate {
			ev.Kind = KindDuplicate
		}
		if r.beforeAck != nil {
			r.beforeAck(msg)
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout)
		if aerr := msg.DoubleAck(actx); aerr != nil {
			ev.Kind, ev.Err = KindAckFailed, aerr
		}
		cancel()
	case ctx.Err() != nil:
		// Shutting down: whatever ran was rolled back (or, if the commit
		// raced the cancel, will be absorbed as a duplicate). Never ack.
		ev.Kind = KindReleased
		r.release(msg)
	case outcome == dedupe.OutcomePoisoned, outcome == dedupe.OutcomeConflict:
		r.term(msg, &ev)
	case outcome == dedupe.OutcomeInFlight:
		ev.Kind, ev.Delay = KindInFlight, r.cfg.InFlightDelay
		r.nak(msg, &ev)
	default:
		// The handler failed (OutcomeRetry) or the database did.
		attempt := int(ev.Delivery)
		if he, ok := errors.AsType[*dedupe.HandlerError](err); ok {
			attempt = he.Attempt
		}
		ev.Kind, ev.Delay = KindRetry, r.cfg.Backoff(max(attempt, 1))
		r.nak(msg, &ev)
	}
	r.cfg.Metrics.Observe(ctx, ev)
	return ev
}

func (r *Runner) nak(msg jetstream.Msg, ev *Event) {
	if err := msg.NakWithDelay(ev.Delay); err != nil {
		r.cfg.Logger.Warn("dedupenats: nak", "subject", msg.Subject(), "key", ev.Key.ID, "err", err)
	}
}

// maxReason bounds the reason sent with Term.
const maxReason = 200

func (r *Runner) term(msg jetstream.Msg, ev *Event) {
	ev.Kind = KindTerminated
	reason := "dedupe: terminated"
	if ev.Err != nil {
		reason = ev.Err.Error()
	}
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	if err := msg.TermWithReason(reason); err != nil {
		r.cfg.Logger.Warn("dedupenats: term", "subject", msg.Subject(), "key", ev.Key.ID, "err", err)
	}
}

// heartbeat marks msg in progress every Config.Heartbeat until the returned
// stop is called.
func (r *Runner) heartbeat(msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := msg.InProgress(); err != nil {
					r.cfg.Logger.Debug("dedupenats: in progress", "subject", msg.Subject(), "err", err)
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
