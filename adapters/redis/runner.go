package deduperedis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
)

// Runner consumes a Redis stream through a consumer group with exactly-once
// effects. Build it with New; it is safe for concurrent use, and Run may be
// called again after it returned (not while it runs: one Runner is one
// consumer of the group).
type Runner struct {
	rdb      redis.Cmdable
	stream   string
	group    string
	consumer *dedupe.Consumer[*Message]
	inbox    *dedupe.Inbox
	cfg      Config
	held     *heartbeat
	obs      dedupe.Observer                   // the inbox's, told of transport events
	describe func(*Message) dedupe.MessageInfo // what obs is told of an entry
	busy     atomic.Int64                      // entries taken and not yet settled
	freed    chan struct{}                     // signalled when busy drops
}

// New returns a Runner that handles the entries of stream, read through the
// consumer group group (created with MKSTREAM at Config.StartID when
// missing), with h, claiming their keys in inbox; the zero Config is the
// defaults. The handler writes its effects through the transaction it is
// given; they commit together with the claim, and only then is the entry
// acknowledged (XACK).
//
// h receives the transaction of the inbox's driver: a pgx.Tx for an inbox
// over a pgx pool, a *sql.Tx for an inbox over dedupe.SQL. A handler of the
// other type is refused with a *dedupe.ConfigError. rdb is a *redis.Client
// (or any redis.Cmdable: a failover or cluster client).
func New[TTx any](inbox *dedupe.Inbox, rdb redis.Cmdable, stream, group string, cfg Config, h dedupe.TxHandlerFunc[TTx, *Message]) (*Runner, error) {
	switch {
	case inbox == nil:
		return nil, &dedupe.ConfigError{Field: "inbox", Reason: "must not be nil"}
	case rdb == nil:
		return nil, &dedupe.ConfigError{Field: "rdb", Reason: "must not be nil"}
	case stream == "":
		return nil, &dedupe.ConfigError{Field: "stream", Reason: "is required"}
	case group == "":
		return nil, &dedupe.ConfigError{Field: "group", Reason: "is required"}
	case h == nil:
		return nil, &dedupe.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults(inbox, group)
	if err != nil {
		return nil, err
	}
	keyFn := c.Key
	desc := describe(group)
	dc, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[*Message]{
		Scope: c.Scope,
		Key: func(msg *Message) (string, error) {
			id, err := keyFn(msg)
			if err != nil {
				return "", &KeyError{Stream: msg.Stream, ID: msg.ID, Err: err}
			}
			return id, nil
		},
		Fingerprint: c.Fingerprint,
		IsoLevel:    c.IsoLevel,
		LockTimeout: c.LockTimeout,
		MaxAttempts: c.MaxAttempts,
		Describe:    desc,
	}, h)
	if err != nil {
		return nil, err
	}
	r := &Runner{rdb: rdb, stream: stream, group: group, consumer: dc, inbox: inbox, cfg: c,
		obs: inbox.Config().Observer, describe: desc, freed: make(chan struct{}, 1)}
	r.held = newHeartbeat(r)
	return r, nil
}

// Scope returns the scope the runner claims keys in.
func (r *Runner) Scope() string { return r.cfg.Scope }

// Config returns the runner's configuration with defaults filled in.
func (r *Runner) Config() Config { return r.cfg }

// Stream returns the stream the runner reads.
func (r *Runner) Stream() string { return r.stream }

// Group returns the runner's consumer group.
func (r *Runner) Group() string { return r.group }

// CreateGroup creates the runner's consumer group at Config.StartID, and
// the stream with it (MKSTREAM), unless the group exists. Run calls it.
func (r *Runner) CreateGroup(ctx context.Context) error { return r.createGroup(ctx, r.cfg.StartID) }

func (r *Runner) createGroup(ctx context.Context, start string) error {
	err := r.rdb.XGroupCreateMkStream(ctx, r.stream, r.group, start).Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("deduperedis: create group %s on %s: %w", r.group, r.stream, err)
	}
	return nil
}

// Run reads and handles entries with Config.Workers workers until ctx is
// cancelled: new entries (XREADGROUP >) and, every Config.ClaimInterval,
// entries other consumers left pending longer than Config.ClaimIdle
// (XAUTOCLAIM). Then it stops reading (after the open XREADGROUP returns,
// at most Config.Block, so that no entry Redis delivered goes unseen), lets
// the entries it holds finish within Config.DrainTimeout (after which their
// transactions are cancelled and rolled back; the entries stay pending and
// another consumer reclaims them), and returns nil.
//
// Redis being unreachable does not end Run: it tries again with
// Config.Backoff, and recreates the group (at "0") when it finds it gone.
// Run returns an error when the group cannot be created at the start, or
// when the stream's key holds something else than a stream.
func (r *Runner) Run(ctx context.Context) error {
	for try := 1; ; try++ {
		err := r.CreateGroup(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if redis.HasErrorPrefix(err, "WRONGTYPE") || try >= 5 {
			return err
		}
		r.cfg.Logger.WarnContext(ctx, "deduperedis: create group", "stream", r.stream, "group", r.group, "err", err)
		sleep(ctx, nil, r.cfg.Backoff(try))
	}
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
	})
	defer func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}()

	beat, stopBeat := context.WithCancel(context.WithoutCancel(ctx))
	beatDone := make(chan struct{})
	go func() { defer close(beatDone); r.held.run(beat) }()

	// Every entry taken counts in busy until it is settled, so the queue
	// never holds more than the runner's capacity and a send never blocks.
	queue := make(chan *Message, r.cfg.Workers+r.cfg.MaxPending)
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Go(func() {
			for m := range queue {
				r.handle(work, ctx.Done(), m)
			}
		})
	}
	err := r.read(ctx, queue)
	close(queue)
	wg.Wait()
	stopBeat()
	<-beatDone
	return err
}

// take counts n entries as held until done is called for each.
func (r *Runner) take(m *Message) { r.busy.Add(1); r.held.hold(m.ID) }

// done settles an entry taken by take.
func (r *Runner) done(m *Message) {
	r.held.let(m.ID)
	r.busy.Add(-1)
	select {
	case r.freed <- struct{}{}:
	default:
	}
}

// read fills queue with entries until ctx is cancelled.
func (r *Runner) read(ctx context.Context, queue chan<- *Message) error {
	// Replies are read whatever ctx says: an entry Redis delivered is in
	// this consumer's pending list and must be seen.
	rctx := context.WithoutCancel(ctx)
	cursor := "0-0"
	var lastPass time.Time
	for failures := 0; ; {
		free, ok := r.room(ctx)
		if !ok {
			return nil
		}
		var (
			msgs []*Message
			err  error
		)
		if cursor != "0-0" || time.Since(lastPass) >= r.cfg.ClaimInterval {
			msgs, cursor, err = r.reclaim(rctx, cursor, free)
			if err == nil && cursor == "0-0" {
				lastPass = time.Now()
			}
		}
		if err == nil && len(msgs) == 0 {
			msgs, err = r.readNew(rctx, free)
		}
		for _, m := range msgs {
			r.take(m)
			queue <- m
		}
		if err == nil {
			failures = 0
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case redis.HasErrorPrefix(err, "NOGROUP"):
			// The group (and probably the stream) is gone: Redis restarted
			// without persistence, or someone deleted the key. Whatever is
			// added now is new; create the group at the beginning.
			r.cfg.Logger.WarnContext(ctx, "deduperedis: consumer group missing; creating it again at 0",
				"stream", r.stream, "group", r.group, "err", err)
			if cerr := r.createGroup(rctx, "0"); cerr == nil {
				cursor = "0-0"
				continue
			}
		case redis.HasErrorPrefix(err, "WRONGTYPE"):
			return fmt.Errorf("deduperedis: read %s: %w", r.stream, err)
		}
		failures++
		delay := r.cfg.Backoff(failures)
		r.cfg.Logger.WarnContext(ctx, "deduperedis: read", "stream", r.stream, "group", r.group, "err", err, "retry_in", delay)
		sleep(ctx, nil, delay)
	}
}

// room waits until at least half of MaxPending (at least one) of the
// runner's capacity (Workers+MaxPending) is free and returns how much is,
// or false when ctx is done.
func (r *Runner) room(ctx context.Context) (int, bool) {
	capacity := r.cfg.Workers + r.cfg.MaxPending
	low := max(1, (r.cfg.MaxPending+1)/2)
	for {
		if ctx.Err() != nil {
			return 0, false
		}
		if free := capacity - int(r.busy.Load()); free >= low {
			return free, true
		}
		t := time.NewTimer(time.Second)
		select {
		case <-r.freed:
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// readNew reads up to n new entries (XREADGROUP >), waiting at most
// Config.Block.
func (r *Runner) readNew(ctx context.Context, n int) ([]*Message, error) {
	res, err := r.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: r.group, Consumer: r.cfg.Consumer, Streams: []string{r.stream, ">"},
		Count: int64(n), Block: r.cfg.Block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Message
	for _, s := range res {
		for _, x := range s.Messages {
			out = append(out, &Message{Stream: r.stream, ID: x.ID, Values: x.Values, Deliveries: 1})
		}
	}
	return out, nil
}

// reclaim takes up to n entries other consumers left pending longer than
// ClaimIdle (XAUTOCLAIM from cursor), with their delivery counts, and
// returns them and the next cursor ("0-0" at the end of a pass). An id
// whose entry was deleted from the stream (trimmed) is returned as an entry
// without fields, marked gone, to be reported.
func (r *Runner) reclaim(ctx context.Context, cursor string, n int) ([]*Message, string, error) {
	got, next, deleted, err := r.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
		Stream: r.stream, Group: r.group, Consumer: r.cfg.Consumer,
		MinIdle: r.cfg.ClaimIdle, Start: cursor, Count: int64(n),
	}).Result()
	if err != nil {
		return nil, cursor, err
	}
	out := make([]*Message, 0, len(got)+len(deleted))
	for _, x := range got {
		if x.Values == nil {
			// Redis 6 reports a deleted entry as one without fields.
			out = append(out, &Message{Stream: r.stream, ID: x.ID, gone: true})
			continue
		}
		out = append(out, &Message{Stream: r.stream, ID: x.ID, Values: x.Values})
	}
	for _, id := range deleted {
		out = append(out, &Message{Stream: r.stream, ID: id, gone: true})
	}
	if len(got) > 0 {
		r.deliveries(ctx, got, out)
	}
	return out, next, nil
}

// deliveries fills in the delivery counts of reclaimed entries from the
// group's pending list (XPENDING); an entry not found keeps 0 (unknown).
func (r *Runner) deliveries(ctx context.Context, got []redis.XMessage, msgs []*Message) {
	pend, err := r.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: r.stream, Group: r.group, Start: got[0].ID, End: got[len(got)-1].ID,
		Count: int64(len(got) + r.held.count() + 16), Consumer: r.cfg.Consumer,
	}).Result()
	if err != nil {
		r.cfg.Logger.WarnContext(ctx, "deduperedis: delivery counts of reclaimed entries", "stream", r.stream, "err", err)
		return
	}
	counts := make(map[string]int64, len(pend))
	for _, p := range pend {
		counts[p.ID] = p.RetryCount
	}
	for _, m := range msgs {
		m.Deliveries = counts[m.ID]
	}
}

// randomSuffix is 8 random hex digits, for a default consumer name.
func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
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
