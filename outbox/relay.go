package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// Defaults of RelayConfig.
const (
	DefaultRelayBatchSize       = 100
	DefaultRelayPollInterval    = time.Second
	DefaultRelayPublishTimeout  = 30 * time.Second
	DefaultRelayMaxAttempts     = 10
	DefaultRelayMinBackoff      = 500 * time.Millisecond
	DefaultRelayMaxBackoff      = time.Minute
	DefaultRelayRetention       = 24 * time.Hour
	DefaultRelayCleanupInterval = time.Minute
	DefaultRelayStatsInterval   = 15 * time.Second
	DefaultRelayShutdownTimeout = 10 * time.Second
)

// RelayConfig configures a Relay. The zero value is usable.
type RelayConfig struct {
	// BatchSize bounds the messages claimed per cycle. Defaults to 100.
	BatchSize int
	// ScanWindow bounds the pending rows one claim examines: it walks the
	// pending rows in id order from the oldest (after the relay's cursor)
	// and stops at a full batch or after ScanWindow ids. Only rows that
	// cannot be claimed make it walk that far: a long backlog of a few keys
	// (a key's later rows wait for its oldest), a parked key's backlog, or
	// rows other relays hold. When a window holds nothing claimable the
	// cursor moves past it. Defaults to 10 × BatchSize.
	ScanWindow int
	// PollInterval is how often the relay looks for messages when no
	// notification woke it (the fallback of LISTEN/NOTIFY, and the pace of
	// retries). Defaults to 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY wake-ups off, leaving polling only.
	// Defaults to false.
	DisableListen bool
	// ListenConn opens the dedicated connection the relay LISTENs on.
	// Defaults to a new connection with the pool's settings when the
	// outbox's dedupe.DB is a *pgxpool.Pool, and to polling only otherwise: an
	// outbox over SQL (database/sql cannot LISTEN) polls every
	// PollInterval, which NewRelay logs at Info. With database/sql over
	// pgx's stdlib or lib/pq, ListenConn may open a pgx connection to the
	// same database to be woken at once.
	ListenConn func(ctx context.Context) (*pgx.Conn, error)
	// PublishTimeout bounds one call of Publisher.Publish. Defaults to 30s.
	PublishTimeout time.Duration
	// MaxAttempts is how many failed publishes a message gets before it is
	// parked with its last error. Only failures of the message itself count
	// (see HealthCheck), not those of a broker outage. Defaults to 10;
	// negative never parks.
	MaxAttempts int
	// HealthCheck tells a broker outage from messages that fail, when a
	// cycle published nothing: it returns nil when the broker is reachable
	// (the failures are the messages': each counts toward its attempts) and
	// an error when it is not (an outage: no attempt is counted and the
	// relay pauses). It is called with a context bounded by PublishTimeout.
	// Defaults to the Publisher's CheckHealth method when it implements
	// HealthChecker, else to none: then the failures of a cycle that
	// published nothing are an outage when they span two or more keys
	// (messages without a key each count as one), and the message's own
	// when they are one key's.
	HealthCheck func(ctx context.Context) error
	// MinBackoff is the delay before the first retry of a failed message
	// (doubling per attempt, with jitter) and the relay's first pause in a
	// broker outage. Defaults to 500ms.
	MinBackoff time.Duration
	// MaxBackoff caps those delays. Defaults to 1m.
	MaxBackoff time.Duration
	// DeletePublished deletes rows once published instead of marking them.
	// Defaults to false: published rows are kept for Retention (their IDs
	// stay known to Enqueue) and then deleted by the relay.
	DeletePublished bool
	// Retention is how long published (and discarded) rows are kept, on
	// the database's clock. Defaults to 24h.
	Retention time.Duration
	// CleanupInterval is how often the relay deletes published and
	// discarded rows past Retention, in batches of the outbox Config's
	// CleanupBatchSize. Defaults to 1m.
	CleanupInterval time.Duration
	// StatsInterval is how often the Observer's OutboxQueued is called.
	// Defaults to 15s.
	StatsInterval time.Duration
	// ShutdownTimeout bounds how long Run, once its context is cancelled,
	// waits for the batch in flight to be confirmed and recorded. Defaults
	// to 10s.
	ShutdownTimeout time.Duration
	// Observer is told of every publish, park and the outbox's backlog.
	// Defaults to the outbox's Config.Observer.
	Observer Observer
	// Logger receives the relay's logs. Defaults to the outbox's
	// Config.Logger.
	Logger *slog.Logger
}

func (c RelayConfig) withDefaults(o *Outbox, pub Publisher) (RelayConfig, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultRelayBatchSize
	}
	if c.ScanWindow == 0 {
		c.ScanWindow = 10 * c.BatchSize
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultRelayMaxAttempts
	}
	def(&c.PollInterval, DefaultRelayPollInterval)
	def(&c.PublishTimeout, DefaultRelayPublishTimeout)
	def(&c.MinBackoff, DefaultRelayMinBackoff)
	def(&c.MaxBackoff, DefaultRelayMaxBackoff)
	def(&c.Retention, DefaultRelayRetention)
	def(&c.CleanupInterval, DefaultRelayCleanupInterval)
	def(&c.StatsInterval, DefaultRelayStatsInterval)
	def(&c.ShutdownTimeout, DefaultRelayShutdownTimeout)
	if c.Observer == nil {
		c.Observer = o.cfg.Observer
	}
	if c.Logger == nil {
		c.Logger = o.cfg.Logger
	}
	if hc, ok := pub.(HealthChecker); ok && c.HealthCheck == nil {
		c.HealthCheck = hc.CheckHealth
	}
	if c.ListenConn == nil && !c.DisableListen {
		if p := o.drv.ListenPool(); p != nil {
			cc := p.Config().ConnConfig
			c.ListenConn = func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cc.Copy()) }
		} else {
			c.Logger.Info("dedupe: the relay polls for new messages every PollInterval: its outbox's dedupe.DB cannot LISTEN "+
				"(a database/sql handle, or a single connection); set RelayConfig.ListenConn to be woken at once",
				"poll_interval", c.PollInterval)
		}
	}
	for name, d := range map[string]time.Duration{"PollInterval": c.PollInterval, "PublishTimeout": c.PublishTimeout,
		"MinBackoff": c.MinBackoff, "MaxBackoff": c.MaxBackoff, "Retention": c.Retention,
		"CleanupInterval": c.CleanupInterval, "StatsInterval": c.StatsInterval, "ShutdownTimeout": c.ShutdownTimeout} {
		if d < 0 {
			return c, &dedupe.ConfigError{Field: name, Reason: "must be positive"}
		}
	}
	switch {
	case c.BatchSize < 0:
		return c, &dedupe.ConfigError{Field: "BatchSize", Reason: "must be positive"}
	case c.ScanWindow < c.BatchSize:
		return c, &dedupe.ConfigError{Field: "ScanWindow", Reason: "must be at least BatchSize"}
	case c.MaxBackoff < c.MinBackoff:
		return c, &dedupe.ConfigError{Field: "MaxBackoff", Reason: "must be at least MinBackoff"}
	}
	return c, nil
}

// Relay publishes the outbox's committed messages through a Publisher. Any
// number of relays may run on one outbox, in one process or many: each cycle
// claims a batch with FOR UPDATE SKIP LOCKED, so no message is published by
// two relays at once, and a key's messages go out in commit order, never two
// in flight. A row is marked published (or deleted) only after the broker
// confirmed it, in the transaction that claimed it; a relay that dies in
// between leaves the row to be sent again, so delivery is at least once and
// consumers deduplicate by Message.ID.
//
// A failed publish is retried with exponential backoff while the other keys
// keep flowing; after MaxAttempts (or at once for a Permanent error) the
// message is parked with its error, visible through Outbox.Parked and
// Outbox.Stats, and it holds back the later messages of its key until an
// operator unparks or discards it: order is never given up silently. A
// cycle that published nothing is taken for a broker outage when the health
// check says so, or without one when its failures span several keys: then
// no attempt is counted, and the relay pauses with backoff.
//
// Every time the relay decides on (retries, parking, retention, lag) is the
// database's clock; see New.
type Relay struct {
	ob      *Outbox
	pub     Publisher
	cfg     RelayConfig
	running atomic.Bool
	cursor  atomic.Int64 // the id after which the next claim's window starts
}

// NewRelay returns a relay that publishes ob's messages through pub.
func NewRelay(ob *Outbox, pub Publisher, cfg RelayConfig) (*Relay, error) {
	switch {
	case ob == nil || ob.db == nil:
		return nil, &dedupe.ConfigError{Field: "outbox", Reason: "must not be nil (build it with New)"}
	case pub == nil:
		return nil, &dedupe.ConfigError{Field: "publisher", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults(ob, pub)
	if err != nil {
		return nil, err
	}
	return &Relay{ob: ob, pub: pub, cfg: c}, nil
}

// Config returns the relay's configuration with defaults filled in.
func (r *Relay) Config() RelayConfig { return r.cfg }

// Run publishes until ctx is cancelled: it runs a cycle whenever a
// notification arrives (a transaction that enqueued committed), every
// PollInterval, and at once again after a full batch; it pauses with backoff
// while the broker is unreachable, and it deletes published rows past
// Retention. On cancellation it lets the batch in flight finish (within
// ShutdownTimeout) and returns nil. It returns an error only when the outbox table is missing
// (dedupe.ErrNotMigrated); every other failure, a lost connection included, is
// retried with backoff.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRelayRunning
	}
	defer r.running.Store(false)

	wake := make(chan struct{}, 1)
	if r.cfg.ListenConn != nil && !r.cfg.DisableListen {
		lctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { r.listen(lctx, wake) })
		defer func() { cancel(); wg.Wait() }()
	}

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var (
		pause       time.Duration // backoff while the broker is unreachable
		nextCleanup time.Time
		nextStats   time.Time
	)
	for ctx.Err() == nil {
		if now := time.Now(); !now.Before(nextCleanup) {
			nextCleanup = now.Add(r.cfg.CleanupInterval)
			if _, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.WarnContext(ctx, "dedupe: outbox cleanup failed", "err", err)
			}
		}
		if now := time.Now(); r.cfg.Observer != nil && !now.Before(nextStats) {
			nextStats = now.Add(r.cfg.StatsInterval)
			if s, err := r.ob.Stats(ctx); err == nil {
				r.cfg.Observer.OutboxQueued(ctx, s)
			}
		}

		cctx, cancel := graceContext(ctx, r.cfg.ShutdownTimeout)
		res, err := r.cycle(cctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case errors.Is(err, dedupe.ErrNotMigrated):
			return fmt.Errorf("dedupe: relay: %w", err)
		case err != nil:
			pause = r.nextPause(pause)
			wait = r.jitter(pause)
			r.cfg.Logger.WarnContext(ctx, "dedupe: outbox relay cycle failed", "err", err, "retry_in", wait)
		case res.claimed >= r.cfg.BatchSize || res.more:
			pause = 0
			continue
		default:
			pause = 0
			wait = r.cfg.PollInterval
		}
		timer.Reset(wait)
		if pause > 0 {
			// Broker or database trouble: wait out the pause, ignoring
			// notifications so as not to hammer it.
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
			continue
		}
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-wake:
			timer.Stop()
		}
	}
	return nil
}

// graceContext returns a context that is not cancelled with parent but only
// grace after it, so that work in flight at shutdown can finish.
func graceContext(parent context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	var t atomic.Pointer[time.Timer]
	stop := context.AfterFunc(parent, func() { t.Store(time.AfterFunc(grace, cancel)) })
	return ctx, func() {
		stop()
		if tm := t.Load(); tm != nil {
			tm.Stop()
		}
		cancel()
	}
}

// cycleResult is what one cycle did.
type cycleResult struct {
	claimed, published, failed int
	more                       bool // claimable rows may lie past the window: look again at once
}

// Cycle runs one relay cycle: it claims a batch, publishes it and records the
// outcome, and returns how many messages the broker confirmed. A message
// whose publish failed is scheduled for a retry, or parked. When the cycle
// published nothing and the failures are taken for a broker outage (see
// RelayConfig.HealthCheck), Cycle returns a *PublishError and counts none of
// them. Run calls Cycle in a loop; call it directly to drive a relay
// yourself (from a cron job, or in tests).
func (r *Relay) Cycle(ctx context.Context) (int, error) {
	res, err := r.cycle(ctx)
	return res.published, err
}

func (r *Relay) cycle(ctx context.Context) (res cycleResult, err error) {
	b := r.ob.drv.NewBatch(pgx.TxOptions{})
	first := r.queueFirstWindow(b)
	tx, err := r.ob.drv.Begin(ctx, pgx.TxOptions{}, b)
	if err != nil {
		return res, translate(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	batch, more, err := r.claim(ctx, tx, first)
	res.more = more
	if err != nil || len(batch) == 0 {
		return res, err
	}
	res.claimed = len(batch)

	obs := r.startPublish(ctx, batch)
	confirmed, failures := r.publish(ctx, batch)
	res.published, res.failed = len(confirmed), len(failures)
	counted, outage := r.judge(ctx, len(confirmed), failures)
	rec, err := r.record(ctx, tx, confirmed, counted)
	if err == nil {
		err = translate(tx.Commit(ctx))
	}
	if err != nil {
		obs.fail(batch, err)
		return res, err
	}
	r.report(ctx, rec, obs)
	if len(outage) > 0 {
		// The broker is down (or we are shutting down): those rows are left
		// as they were for a later cycle.
		for _, f := range outage {
			obs.done(f.msg, PublishDone{Err: f.err})
		}
		return res, &PublishError{Failed: len(outage), Err: outage[0].err}
	}
	return res, nil
}

// Two delays grow with failures: a failed message's retry (its own
// attempts, scheduled in its row on the database's clock) and the relay's
// pause in a broker outage (in Run). Both are the relay's dedupe.Backoff: doubling
// from MinBackoff up to MaxBackoff, shortened at random by up to 20% so
// that relays and messages do not retry in step.

// relayJitter is the spread of the relay's delays.
const relayJitter = 0.2

// backoffPolicy is the relay's dedupe.Backoff.
func (r *Relay) backoffPolicy() dedupe.Backoff {
	return dedupe.Backoff{Min: r.cfg.MinBackoff, Max: r.cfg.MaxBackoff, Jitter: relayJitter}
}

// backoff is the jittered delay after a message's attempt-th failure.
func (r *Relay) backoff(attempt int) time.Duration { return r.backoffPolicy().Delay(attempt) }

// nextPause is the relay's pause after another failed cycle, given the last
// (unjittered; jitter each wait with r.jitter).
func (r *Relay) nextPause(pause time.Duration) time.Duration { return r.backoffPolicy().Next(pause) }

// jitter spreads d as the relay's delays are spread.
func (r *Relay) jitter(d time.Duration) time.Duration { return r.backoffPolicy().Jittered(d) }

// Cleanup deletes published and discarded rows older than Retention on the
// database's clock, in bounded batches, and returns how many it deleted. Run
// calls it every CleanupInterval.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := r.ob.db.Exec(ctx, r.ob.q.cleanup, r.ob.dbNow(), seconds(r.cfg.Retention), r.ob.cfg.CleanupBatchSize)
		if err != nil {
			return total, translate(err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.ob.cfg.CleanupBatchSize) {
			return total, nil
		}
	}
}
