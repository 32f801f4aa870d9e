// Package dedupekafka gives kafka-go consumer groups exactly-once effects.
//
// A Runner fetches messages from a *kafka.Reader in a consumer group, handles
// each inside a PostgreSQL transaction that also claims the message's key in
// the dedupe inbox, commits that transaction, and only then commits the
// message's offset. A crash between the two commits makes Kafka redeliver
// the message (to this member or, after a rebalance, to another one); the
// inbox recognises the key and the effects are not repeated.
//
// Messages of one partition are handled in order, partitions concurrently.
// In per-message mode (BatchSize 1) each message gets its own transaction and
// offset commit. In batch mode (BatchSize > 1) up to BatchSize messages of a
// partition are claimed with one statement, the handler runs for the new ones
// in that same transaction, and one database commit is followed by one offset
// commit. When a handler fails inside a batch the batch is rolled back and
// its messages are handled again one transaction each, so the failure
// neither loses nor duplicates the others; the failed message is retried
// with backoff until it succeeds or its attempts are used up, after which
// its key is marked failed, it is optionally written to a dead-letter topic,
// and its offset is committed.
package dedupekafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// Runner consumes a reader's partitions with exactly-once effects. Build it
// with New or NewBatch and call Run once.
//
// One fetch loop feeds a worker per partition. kafka-go delivers every
// partition through one stream, so a partition that waits to retry a failing
// message holds the others back once its buffer (2×BatchSize, at least 16
// messages) is full. After a rebalance a worker may still finish and commit
// messages of a partition it lost; such a late commit can only move the
// group's offset back, which causes redeliveries that the inbox absorbs.
//
// A per-message HandlerFunc may record a result with
// dedupe.ClaimFromContext(ctx).SetResult in either mode; it is stored with
// the key in the handler's transaction.
type Runner struct {
	inbox    *dedupe.Inbox
	reader   Reader
	cfg      Config
	handler  HandlerFunc      // per-message handler (New), or nil
	batchH   BatchHandlerFunc // batch handler (NewBatch), or nil
	consumer *dedupe.Consumer[kafka.Message]
	stats    stats
	running  atomic.Bool
}

// New returns a Runner that handles the messages of reader with h. The
// reader must have a GroupID (ErrNoGroup otherwise) and should not use
// CommitInterval: the Runner commits offsets itself, after the database.
func New(inbox *dedupe.Inbox, reader Reader, cfg Config, h HandlerFunc) (*Runner, error) {
	if h == nil {
		return nil, &dedupe.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	return newRunner(inbox, reader, cfg, h, nil)
}

// NewBatch returns a Runner in batch mode whose handler gets the new messages
// of each batch together; see BatchHandlerFunc. Config.BatchSize defaults to
// DefaultBatchHandlerSize.
func NewBatch(inbox *dedupe.Inbox, reader Reader, cfg Config, h BatchHandlerFunc) (*Runner, error) {
	if h == nil {
		return nil, &dedupe.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchHandlerSize
	}
	return newRunner(inbox, reader, cfg, nil, h)
}

func newRunner(inbox *dedupe.Inbox, reader Reader, cfg Config, h HandlerFunc, bh BatchHandlerFunc) (*Runner, error) {
	switch {
	case inbox == nil:
		return nil, &dedupe.ConfigError{Field: "inbox", Reason: "must not be nil"}
	case reader == nil:
		return nil, &dedupe.ConfigError{Field: "reader", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults(inbox, reader)
	if err != nil {
		return nil, err
	}
	if c.MaxAttempts != 0 {
		// ClaimBatch and RecordFailure count attempts against their inbox's
		// MaxAttempts: give the runner an inbox over the same table with its
		// own, so that batch mode and per-message mode give up alike.
		ic := inbox.Config()
		ic.MaxAttempts = c.MaxAttempts
		if inbox, err = dedupe.New(inbox.DB(), &ic); err != nil {
			return nil, err
		}
	}
	r := &Runner{inbox: inbox, reader: reader, cfg: c, handler: h, batchH: bh}
	r.consumer, err = dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[kafka.Message]{
		Scope:       c.Scope,
		Key:         r.keyID,
		Fingerprint: c.Fingerprint,
		IsoLevel:    c.IsoLevel,
	}, r.consumerHandler)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Scope returns the scope the runner's keys are claimed in.
func (r *Runner) Scope() string { return r.cfg.Scope }

// KeyOf returns the inbox key of msg.
func (r *Runner) KeyOf(msg kafka.Message) (dedupe.Key, error) { return r.consumer.KeyOf(msg) }

func (r *Runner) keyID(msg kafka.Message) (string, error) {
	if r.cfg.Key != nil {
		return r.cfg.Key(msg)
	}
	return KeyFromHeaders(msg, r.cfg.KeyHeaders...), nil
}

type partition struct {
	topic string
	id    int
}

// Run fetches and handles messages until ctx is cancelled, then waits for
// its partition workers and returns nil. It returns an error matching io.EOF
// when the reader was closed under it. Offsets whose effects did not commit
// are never committed; they are redelivered when the group next reads the
// partition.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("dedupekafka: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	workers := make(map[partition]chan kafka.Message)
	backoff := r.cfg.RetryBackoff
	for {
		msg, err := r.reader.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("dedupekafka: reader closed: %w", err)
			}
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: fetch failed", "err", err)
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(2*backoff, r.cfg.MaxRetryBackoff)
			continue
		}
		backoff = r.cfg.RetryBackoff
		r.stats.fetched.Add(1)
		p := partition{msg.Topic, msg.Partition}
		ch, ok := workers[p]
		if !ok {
			ch = make(chan kafka.Message, max(2*r.cfg.BatchSize, 16))
			workers[p] = ch
			wg.Go(func() { r.work(ctx, ch) })
		}
		select {
		case ch <- msg:
		case <-ctx.Done():
			return nil
		}
	}
}

// work handles one partition's messages in order until ctx ends.
func (r *Runner) work(ctx context.Context, ch <-chan kafka.Message) {
	batch := make([]kafka.Message, 0, r.cfg.BatchSize)
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-ch:
			batch = append(batch[:0], m)
		}
		if r.cfg.BatchSize > 1 {
			batch = r.fill(ctx, ch, batch)
		}
		var done bool
		if len(batch) == 1 {
			done = r.handleOne(ctx, batch[0], nil)
		} else {
			done = r.handleBatch(ctx, batch)
		}
		if !done {
			return // cancelled: nothing of this batch is committed to Kafka
		}
		// The highest offset: after a rebalance the same partition may be
		// re-read from an older offset within one batch.
		last := batch[0]
		for _, m := range batch[1:] {
			if m.Offset > last.Offset {
				last = m
			}
		}
		r.commit(ctx, last)
	}
}

// fill adds queued messages to batch up to BatchSize, waiting at most Linger
// for more.
func (r *Runner) fill(ctx context.Context, ch <-chan kafka.Message, batch []kafka.Message) []kafka.Message {
	var timer <-chan time.Time
	for len(batch) < r.cfg.BatchSize {
		select {
		case m := <-ch:
			batch = append(batch, m)
			continue
		default:
		}
		if timer == nil {
			t := time.NewTimer(r.cfg.Linger)
			defer t.Stop()
			timer = t.C
		}
		select {
		case m := <-ch:
			batch = append(batch, m)
		case <-timer:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// commit moves the partition's committed offset past msg. It runs even while
// shutting down: the effects are committed, so a redelivery is only waste.
func (r *Runner) commit(ctx context.Context, msg kafka.Message) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CommitTimeout)
	defer cancel()
	if err := r.reader.CommitMessages(cctx, msg); err != nil {
		r.stats.commitErrors.Add(1)
		r.cfg.Logger.WarnContext(ctx, "dedupekafka: offset commit failed; the messages will be redelivered and absorbed by the inbox",
			"topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "err", err)
		return
	}
	r.stats.commits.Add(1)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
