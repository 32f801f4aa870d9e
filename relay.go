package dedupe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Publisher sends outbox messages to a broker. The JetStream and Kafka
// publishers live in adapters/nats and adapters/kafka.
type Publisher interface {
	// Publish sends msgs and returns once the broker confirmed or refused
	// each one. It returns nil when all were confirmed, or one error per
	// message (nil for a confirmed one). msgs hold at most one message per
	// (Topic, Key), so they may be sent concurrently. Wrap an error with
	// Permanent when retrying that message cannot help: it is parked at once.
	Publish(ctx context.Context, msgs []*OutboxMessage) []error
}

// PublishFunc is a Publisher that sends one message at a time.
type PublishFunc func(ctx context.Context, msg *OutboxMessage) error

// Publish calls f for each message in turn.
func (f PublishFunc) Publish(ctx context.Context, msgs []*OutboxMessage) []error {
	var errs []error
	for i, m := range msgs {
		if err := f(ctx, m); err != nil {
			if errs == nil {
				errs = make([]error, len(msgs))
			}
			errs[i] = err
		}
	}
	return errs
}

// RelayHooks receive the relay's metrics. Every hook is optional and is
// called from the relay's goroutine: keep it fast.
type RelayHooks struct {
	// Queued reports the outbox's unpublished rows every
	// RelayConfig.StatsInterval.
	Queued func(s OutboxStats)
	// Published is called for each message the broker confirmed, with the
	// lag from enqueue to confirmation.
	Published func(msg *OutboxMessage, lag time.Duration)
	// Failed is called for each failed publish; parked says the message was
	// parked by it.
	Failed func(msg *OutboxMessage, err error, parked bool)
}

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
	// ScanWindow bounds the pending rows a cycle examines for claimable
	// ones (the oldest after the relay's cursor). A backlog of a few keys
	// has few claimable rows (only each key's oldest); the window keeps a
	// cycle's cost bounded, and the cursor moves on to later rows when a
	// window yields less than a batch. Defaults to 10 × BatchSize.
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
	// outbox's DB is a *pgxpool.Pool, and to polling only otherwise.
	ListenConn func(ctx context.Context) (*pgx.Conn, error)
	// PublishTimeout bounds one call of Publisher.Publish. Defaults to 30s.
	PublishTimeout time.Duration
	// MaxAttempts is how many failed publishes a message gets before it is
	// parked with its last error. Defaults to 10; negative never parks.
	MaxAttempts int
	// MinBackoff is the delay before the first retry of a failed message
	// (doubling per attempt, with jitter) and the relay's first pause when
	// the broker is unreachable. Defaults to 500ms.
	MinBackoff time.Duration
	// MaxBackoff caps those delays. Defaults to 1m.
	MaxBackoff time.Duration
	// DeletePublished deletes rows once published instead of marking them.
	// Defaults to false: published rows are kept for Retention (their IDs
	// stay known to Enqueue) and then deleted by the relay.
	DeletePublished bool
	// Retention is how long published rows are kept. Defaults to 24h.
	Retention time.Duration
	// CleanupInterval is how often the relay deletes published rows past
	// Retention, in batches of the Config's PurgeBatchSize. Defaults to 1m.
	CleanupInterval time.Duration
	// StatsInterval is how often Hooks.Queued is called. Defaults to 15s.
	StatsInterval time.Duration
	// ShutdownTimeout bounds how long Run, once its context is cancelled,
	// waits for the batch in flight to be confirmed and recorded. Defaults
	// to 10s.
	ShutdownTimeout time.Duration
	// Hooks receive metrics. Defaults to none.
	Hooks RelayHooks
	// Logger receives the relay's logs. Defaults to the outbox's
	// Config.Logger.
	Logger *slog.Logger
}

func (c RelayConfig) withDefaults(o *Outbox) (RelayConfig, error) {
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
	if c.Logger == nil {
		c.Logger = o.cfg.Logger
	}
	if c.ListenConn == nil && !c.DisableListen {
		if p, ok := o.db.(*pgxpool.Pool); ok {
			cc := p.Config().ConnConfig
			c.ListenConn = func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cc.Copy()) }
		}
	}
	for name, d := range map[string]time.Duration{"PollInterval": c.PollInterval, "PublishTimeout": c.PublishTimeout,
		"MinBackoff": c.MinBackoff, "MaxBackoff": c.MaxBackoff, "Retention": c.Retention,
		"CleanupInterval": c.CleanupInterval, "StatsInterval": c.StatsInterval, "ShutdownTimeout": c.ShutdownTimeout} {
		if d < 0 {
			return c, &ConfigError{Field: name, Reason: "must be positive"}
		}
	}
	switch {
	case c.BatchSize < 0:
		return c, &ConfigError{Field: "BatchSize", Reason: "must be positive"}
	case c.ScanWindow < c.BatchSize:
		return c, &ConfigError{Field: "ScanWindow", Reason: "must be at least BatchSize"}
	case c.MaxBackoff < c.MinBackoff:
		return c, &ConfigError{Field: "MaxBackoff", Reason: "must be at least MinBackoff"}
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
// A failed publish is retried with exponential backoff; after MaxAttempts
// (or at once for a Permanent error) the message is parked with its error,
// visible through Outbox.Parked and Outbox.Stats, and it holds back the later
// messages of its key until an operator unparks it: order is never given up
// silently. A cycle in which every publish failed is taken for a broker
// outage: no attempt is counted, and the relay backs off.
type Relay struct {
	ob      *Outbox
	pub     Publisher
	cfg     RelayConfig
	running atomic.Bool
	cursor  atomic.Int64 // the id after which the next cycle's window starts
}

// NewRelay returns a relay that publishes ob's messages through pub.
func NewRelay(ob *Outbox, pub Publisher, cfg RelayConfig) (*Relay, error) {
	switch {
	case ob == nil || ob.db == nil:
		return nil, &ConfigError{Field: "outbox", Reason: "must not be nil (build it with NewOutbox)"}
	case pub == nil:
		return nil, &ConfigError{Field: "publisher", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults(ob)
	if err != nil {
		return nil, err
	}
	return &Relay{ob: ob, pub: pub, cfg: c}, nil
}

// Config returns the relay's configuration with defaults filled in.
func (r *Relay) Config() RelayConfig { return r.cfg }

// Run publishes until ctx is cancelled: it runs a cycle whenever a
// notification arrives (a transaction that enqueued committed), every
// PollInterval, and at once again after a full batch; it backs off while the
// broker is unreachable, and it deletes published rows past Retention. On
// cancellation it lets the batch in flight finish (within ShutdownTimeout)
// and returns nil. It returns an error only when the outbox table is missing
// (ErrNotMigrated); every other failure, a lost connection included, is
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
		if now := time.Now(); r.cfg.Hooks.Queued != nil && !now.Before(nextStats) {
			nextStats = now.Add(r.cfg.StatsInterval)
			if s, err := r.ob.Stats(ctx); err == nil {
				r.cfg.Hooks.Queued(s)
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
		case errors.Is(err, ErrNotMigrated):
			return fmt.Errorf("dedupe: relay: %w", err)
		case err != nil:
			pause = min(max(pause*2, r.cfg.MinBackoff), r.cfg.MaxBackoff)
			wait = jitter(pause)
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

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/5 + rand.N(d/5*2+1)
}

// listen keeps a LISTEN connection open and signals wake on every
// notification, reconnecting with backoff when it fails. Each (re)connect
// signals too, so nothing committed while it was not listening is missed
// until the next poll.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	pause := time.Duration(0)
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		pause = min(max(pause*2, r.cfg.MinBackoff), r.cfg.MaxBackoff)
		r.cfg.Logger.WarnContext(ctx, "dedupe: outbox relay LISTEN failed; polling meanwhile", "err", err, "retry_in", pause)
		t := time.NewTimer(jitter(pause))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := r.cfg.ListenConn(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// The channel is named after the table's oid, looked up on this
	// connection at every (re)connect.
	var channel string
	if err := conn.QueryRow(ctx, r.ob.q.channel, r.ob.table).Scan(&channel); err != nil {
		return translate(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	signal(wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal(wake)
	}
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// cycleResult is what one cycle did.
type cycleResult struct {
	claimed, published, failed int
	more                       bool // the window moved on: look again at once
}

// Cycle runs one relay cycle: it claims a batch, publishes it and records the
// outcome, and returns how many messages the broker confirmed. A message
// whose publish failed is scheduled for a retry, or parked; when every
// publish of the cycle failed, Cycle returns a *PublishError and counts no
// attempts (the broker is taken to be unreachable). Run calls Cycle in a
// loop; call it directly to drive a relay yourself (from a cron job, or in
// tests).
func (r *Relay) Cycle(ctx context.Context) (int, error) {
	res, err := r.cycle(ctx)
	return res.published, err
}

func (r *Relay) cycle(ctx context.Context) (res cycleResult, err error) {
	tx, err := r.ob.db.Begin(ctx)
	if err != nil {
		return res, translate(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	batch, more, err := r.claim(ctx, tx)
	res.more = more
	if err != nil || len(batch) == 0 {
		return res, err
	}
	res.claimed = len(batch)

	confirmed, failures := r.publish(ctx, batch)
	res.published, res.failed = len(confirmed), len(failures)
	if len(confirmed) == 0 && len(failures) > 0 {
		permanent := false
		for _, f := range failures {
			permanent = permanent || IsPermanent(f.err)
		}
		if !permanent || ctx.Err() != nil {
			// Nothing got through: the broker is down (or we are shutting
			// down). Leave the rows as they are for the next cycle.
			for _, f := range failures {
				r.hookFailed(f.msg, f.err, false)
			}
			return res, &PublishError{Failed: len(failures), Err: failures[0].err}
		}
	}
	now := r.ob.cfg.wallClock()
	if len(confirmed) > 0 {
		ids := make([]int64, len(confirmed))
		for i, m := range confirmed {
			ids[i] = m.Seq
		}
		q := r.ob.q.markPublished
		args := []any{ids, now}
		if r.cfg.DeletePublished {
			q, args = r.ob.q.deletePublished, args[:1]
		}
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			return res, translate(err)
		}
	}
	parked := make([]bool, len(failures))
	if len(failures) > 0 {
		var (
			ids     = make([]int64, len(failures))
			errs    = make([]string, len(failures))
			next    = make([]time.Time, len(failures))
			parkAts = make([]*time.Time, len(failures))
		)
		for i, f := range failures {
			ids[i], errs[i] = f.msg.Seq, f.err.Error()
			next[i] = now.Add(jitter(r.backoff(f.msg.Attempt)))
			if IsPermanent(f.err) || (r.cfg.MaxAttempts > 0 && f.msg.Attempt >= r.cfg.MaxAttempts) {
				parkAts[i], parked[i] = &now, true
			}
		}
		if _, err := tx.Exec(ctx, r.ob.q.recordFailures, ids, errs, next, parkAts); err != nil {
			return res, translate(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, translate(err)
	}
	for _, m := range confirmed {
		if r.cfg.Hooks.Published != nil {
			r.cfg.Hooks.Published(m, max(now.Sub(m.CreatedAt), 0))
		}
	}
	for i, f := range failures {
		r.hookFailed(f.msg, f.err, parked[i])
		if parked[i] {
			r.cfg.Logger.ErrorContext(ctx, "dedupe: outbox message parked", "id", f.msg.ID, "topic", f.msg.Topic,
				"key", f.msg.Key, "attempts", f.msg.Attempt, "err", f.err)
		} else {
			r.cfg.Logger.WarnContext(ctx, "dedupe: outbox publish failed", "id", f.msg.ID, "topic", f.msg.Topic,
				"key", f.msg.Key, "attempt", f.msg.Attempt, "err", f.err)
		}
	}
	return res, nil
}

func (r *Relay) hookFailed(m *OutboxMessage, err error, parked bool) {
	if r.cfg.Hooks.Failed != nil {
		r.cfg.Hooks.Failed(m, err, parked)
	}
}

// backoff is the delay after the attempt-th failure.
func (r *Relay) backoff(attempt int) time.Duration {
	d := r.cfg.MinBackoff
	for i := 1; i < attempt && d < r.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.cfg.MaxBackoff)
}

// claim locks a batch in tx: the heads of keys no other relay holds, then the
// later rows of those keys, in id order. A key's later rows are kept only up
// to the first one that is not due or is parked, so order holds.
func (r *Relay) claim(ctx context.Context, tx pgx.Tx) (batch []*OutboxMessage, more bool, err error) {
	now := r.ob.cfg.wallClock()
	cursor := r.cursor.Load()
	rows, err := tx.Query(ctx, r.ob.q.window, cursor, r.cfg.ScanWindow)
	if err != nil {
		return nil, false, translate(err)
	}
	window, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, false, translate(err)
	}
	if len(window) > 0 {
		rows, err = tx.Query(ctx, r.ob.q.claimHeads, now, r.cfg.BatchSize, window)
		if err != nil {
			return nil, false, translate(err)
		}
		if batch, err = pgx.CollectRows(rows, scanOutboxMessage); err != nil {
			return nil, false, translate(err)
		}
	}
	switch {
	case len(window) == r.cfg.ScanWindow && len(batch) < r.cfg.BatchSize:
		// A full window with room to spare: look further next time.
		r.cursor.CompareAndSwap(cursor, window[len(window)-1])
		more = true
	case len(window) < r.cfg.ScanWindow && cursor > 0:
		// Reached the end: start from the oldest again, at the next wake-up
		// or poll (not at once: when every pending row is held back, say
		// behind a parked message, the relay would spin).
		r.cursor.CompareAndSwap(cursor, 0)
	}
	var topics, keys []string
	var heads []int64
	for _, m := range batch {
		if m.Key != "" {
			topics, keys, heads = append(topics, m.Topic), append(keys, m.Key), append(heads, m.Seq)
		}
	}
	if room := r.cfg.BatchSize - len(batch); room > 0 && len(heads) > 0 {
		rows, err := tx.Query(ctx, r.ob.q.claimFollowers, topics, keys, heads, room)
		if err != nil {
			return nil, false, translate(err)
		}
		followers, err := pgx.CollectRows(rows, scanOutboxMessage)
		if err != nil {
			return nil, false, translate(err)
		}
		// Rows come in id order; stop a key at its first gap: a row not yet
		// due or parked, or one cut off by the limit before.
		stopped := map[orderKey]bool{}
		for _, m := range followers {
			k := orderKey{m.Topic, m.Key}
			if stopped[k] || !m.ParkedAt.IsZero() || m.nextAt.After(now) {
				stopped[k] = true
				continue
			}
			batch = append(batch, m)
		}
	}
	for _, m := range batch {
		m.Attempt++ // attempts holds the failures so far
	}
	return batch, more, nil
}

// orderKey is the unit of ordering.
type orderKey struct{ topic, key string }

// failure is one failed publish.
type failure struct {
	msg *OutboxMessage
	err error
}

// publish sends the batch in waves: each wave holds the next message of every
// key (and, in the first, all unkeyed ones), so a key never has two messages
// in flight; a key whose message fails sends nothing more this cycle.
func (r *Relay) publish(ctx context.Context, batch []*OutboxMessage) (confirmed []*OutboxMessage, failures []failure) {
	queues := map[orderKey][]*OutboxMessage{}
	var order []orderKey
	var wave []*OutboxMessage
	for _, m := range batch {
		if m.Key == "" {
			wave = append(wave, m)
			continue
		}
		k := orderKey{m.Topic, m.Key}
		if _, ok := queues[k]; !ok {
			order = append(order, k)
		}
		queues[k] = append(queues[k], m)
	}
	for {
		for _, k := range order {
			if q := queues[k]; len(q) > 0 {
				wave = append(wave, q[0])
				queues[k] = q[1:]
			}
		}
		if len(wave) == 0 {
			return confirmed, failures
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		errs := r.safePublish(pctx, wave)
		cancel()
		for i, m := range wave {
			if errs[i] == nil {
				confirmed = append(confirmed, m)
				continue
			}
			failures = append(failures, failure{m, errs[i]})
			delete(queues, orderKey{m.Topic, m.Key})
		}
		if ctx.Err() != nil {
			return confirmed, failures
		}
		wave = wave[:0:0]
	}
}

// safePublish calls the publisher, turning a panic or a malformed answer into
// errors for every message.
func (r *Relay) safePublish(ctx context.Context, wave []*OutboxMessage) (errs []error) {
	defer func() {
		if v := recover(); v != nil {
			err := &PanicError{Value: v}
			errs = make([]error, len(wave))
			for i := range errs {
				errs[i] = err
			}
		}
	}()
	errs = r.pub.Publish(ctx, wave)
	switch {
	case errs == nil:
		return make([]error, len(wave))
	case len(errs) != len(wave):
		err := fmt.Errorf("dedupe: publisher returned %d results for %d messages", len(errs), len(wave))
		errs = make([]error, len(wave))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// Cleanup deletes published rows older than Retention, in bounded batches,
// and returns how many it deleted. Run calls it every CleanupInterval.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	cutoff := r.ob.cfg.wallClock().Add(-r.cfg.Retention)
	var total int64
	for {
		tag, err := r.ob.db.Exec(ctx, r.ob.q.cleanup, cutoff, r.ob.cfg.PurgeBatchSize)
		if err != nil {
			return total, translate(err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.ob.cfg.PurgeBatchSize) {
			return total, nil
		}
	}
}
