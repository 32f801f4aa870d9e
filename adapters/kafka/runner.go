// Package dedupekafka gives kafka-go consumer groups exactly-once effects.
//
// A Runner joins a consumer group (kafka.ConsumerGroup) and, for every
// partition the group assigns it, runs an independent worker with its own
// partition reader. A worker handles its partition's messages in order, each
// inside a PostgreSQL transaction that also claims the message's key in the
// dedupe inbox; after the database commit it records the partition's next
// offset. A committer sends the latest recorded offset of every partition to
// the group in one request every CommitInterval, and again when the
// partitions are revoked and when the runner stops. A crash between the
// database commit and the offset commit makes Kafka redeliver up to one
// interval of messages (to this member or, after a rebalance, to another
// one); the inbox recognises their keys and the effects are not repeated.
//
// Partitions are independent: a slow, blocked, failing or paused partition
// delays only itself, and its reader stops fetching once its queue
// (ReaderConfig.QueueCapacity) is full. In per-message mode (BatchSize 1) each
// message gets its own transaction. In batch mode (BatchSize > 1) up to
// BatchSize messages of a partition are claimed with one statement, the
// handler runs for the new ones in that same transaction, and one database
// commit covers them. When a handler fails inside a batch the batch is rolled
// back and its messages are handled again one transaction each, so the
// failure neither loses nor duplicates the others; the failed message is
// retried with backoff until it succeeds or its attempts are used up, after
// which its key is marked failed, it is optionally written to a dead-letter
// topic, and its offset is committed.
//
// Every message ends in one visible state: its effects committed once, its
// key failed in the inbox, or a copy in the dead-letter topic. A message
// without a usable key is refused (not guessed): it is recorded failed under
// RefusedKey and dead-lettered. A dead-letter write that keeps failing pauses
// its partition (dedupe.EventPartitionPaused) rather than committing the
// offset without it.
//
// The runner has no metrics of its own. The inbox's Observer
// (dedupe.Config.Observer; dedupeotel's for OpenTelemetry) is told of every
// handling, with the message's topic, partition, offset and headers (the
// handler finds them too, with dedupe.MessageInfoFrom), and of what the
// runner did beyond it, as dedupe.TransportEvent: dedupe.EventRetried (with
// the backoff), EventRefused, EventDeadLettered, EventDeadLetterFailed,
// EventTerminated (a message given up on), EventPartitionPaused,
// EventBatchHandled, EventBatchFallback, EventOffsetsCommitted and
// EventOffsetCommitFailed.
//
// Broker limits, and what the runner does at them:
//
//   - Rebalance: when the group rebalances, every worker's context ends (a
//     handler in progress is cancelled and its transaction rolled back), the
//     committer commits what the workers recorded, within the ending
//     generation, and only then does the member rejoin. A revoked partition's
//     offsets are never committed after it was revoked: the broker refuses a
//     commit of an ended generation. The new owner starts at the committed
//     offset; any redelivery is absorbed by the inbox.
//   - Commit interval: offsets are committed every CommitInterval, so a crash
//     (or a lost commit) redelivers at most one interval of messages, which
//     the inbox absorbs. A commit never names an offset whose effects did not
//     commit.
//   - Retention: messages the broker deletes before they are consumed are
//     gone; kafka-go skips to the first offset the partition still has. The
//     runner logs an error with the range it lost (when a partition starts
//     behind the log, or kafka-go reports the skip), so size retention beyond
//     your longest outage.
//   - Topic recreation: offsets restart with a new topic, so keys derived
//     from offsets (OffsetKeyFallback) would collide with the old topic's and
//     new messages would be dropped as duplicates; that fallback is opt-in for
//     this reason. A committed offset beyond the end of the partition (the
//     topic was recreated or truncated) is logged and consumption resumes at
//     the first offset; deleting a topic starts a new generation (partition
//     changes are watched). Stop consumers before recreating a topic: an
//     offset committed in the instant between deletion and recreation lands
//     on the new topic.
package dedupekafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// Runner consumes a consumer group's partitions with exactly-once effects.
// Build it with New or NewBatch and call Run once.
//
// A per-message HandlerFunc may record a result with
// dedupe.ClaimFromContext(ctx).SetResult in either mode; it is stored with
// the key in the handler's transaction.
type Runner struct {
	inbox    *dedupe.Inbox
	rc       kafka.ReaderConfig
	cfg      Config
	consumer *dedupe.Consumer[kafka.Message]      // one message per transaction
	batch    *dedupe.BatchConsumer[kafka.Message] // a batch per transaction
	errLog   kafka.Logger
	running  atomic.Bool
	obs      dedupe.Observer                        // the inbox's, told of transport events
	describe func(kafka.Message) dedupe.MessageInfo // what obs is told of a message
}

// New returns a Runner that joins the consumer group rc describes and
// handles its messages with h. rc is a kafka-go reader configuration with a
// GroupID (ErrNoGroup otherwise) and a Topic or GroupTopics; the runner
// builds the group member and one partition reader per assigned partition
// from it, so do not also open a kafka.Reader with it. rc.CommitInterval is
// ignored: the runner commits offsets itself, after the database
// (Config.CommitInterval).
//
// h receives the transaction of the inbox's driver: a pgx.Tx (HandlerFunc)
// for an inbox over a pgx pool, a *sql.Tx for an inbox over dedupe.SQL. A
// handler of the other type is refused with a *dedupe.ConfigError.
func New[TTx any](inbox *dedupe.Inbox, rc kafka.ReaderConfig, cfg Config, h dedupe.TxHandlerFunc[TTx, kafka.Message]) (*Runner, error) {
	if h == nil {
		return nil, &dedupe.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	return newRunner(inbox, rc, cfg, func(cc dedupe.ConsumerConfig[kafka.Message]) (consumers, error) {
		// One message at a time and in batches, through the core's
		// consumers: the same transaction driver, guard and attempt counting.
		one, err := dedupe.NewConsumer(inbox, cc, h)
		if err != nil {
			return consumers{}, err
		}
		batch, err := dedupe.NewBatchConsumer(inbox, cc, h)
		return consumers{one, batch}, err
	})
}

// NewBatch returns a Runner in batch mode whose handler gets the new messages
// of each batch together; see BatchHandlerFunc. Config.BatchSize defaults to
// DefaultBatchHandlerSize.
//
// h receives the transaction of the inbox's driver, as for New: a pgx.Tx
// (BatchHandlerFunc), or a *sql.Tx for an inbox over dedupe.SQL.
func NewBatch[TTx any](inbox *dedupe.Inbox, rc kafka.ReaderConfig, cfg Config, h dedupe.TxBatchHandlerFunc[TTx, kafka.Message]) (*Runner, error) {
	if h == nil {
		return nil, &dedupe.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchHandlerSize
	}
	return newRunner(inbox, rc, cfg, func(cc dedupe.ConsumerConfig[kafka.Message]) (consumers, error) {
		one, err := dedupe.NewConsumer(inbox, cc, func(ctx context.Context, tx TTx, m kafka.Message) error {
			return h(ctx, tx, []kafka.Message{m})
		})
		if err != nil {
			return consumers{}, err
		}
		batch, err := dedupe.NewBatchConsumerFunc(inbox, cc, h)
		return consumers{one, batch}, err
	})
}

// consumers are the core's consumers a Runner handles messages with.
type consumers struct {
	one   *dedupe.Consumer[kafka.Message]      // one message per transaction
	batch *dedupe.BatchConsumer[kafka.Message] // a batch per transaction
}

// newRunner validates the configuration and builds the runner's consumers
// with build, which binds the handler (of whatever transaction type) to
// them.
func newRunner(inbox *dedupe.Inbox, rc kafka.ReaderConfig, cfg Config,
	build func(dedupe.ConsumerConfig[kafka.Message]) (consumers, error)) (*Runner, error) {
	if inbox == nil {
		return nil, &dedupe.ConfigError{Field: "inbox", Reason: "must not be nil"}
	}
	if err := checkReaderConfig(rc); err != nil {
		return nil, err
	}
	c, err := cfg.withDefaults(inbox, rc)
	if err != nil {
		return nil, err
	}
	r := &Runner{inbox: inbox, rc: rc, cfg: c, errLog: kafkaLogger{log: c.Logger, next: rc.ErrorLogger},
		obs: inbox.Config().Observer, describe: describe(rc.GroupID)}
	cs, err := build(dedupe.ConsumerConfig[kafka.Message]{
		Scope:       c.Scope,
		Key:         r.keyID,
		Fingerprint: c.Fingerprint,
		IsoLevel:    c.IsoLevel,
		MaxAttempts: c.MaxAttempts,
		Describe:    r.describe,
	})
	if err != nil {
		return nil, err
	}
	r.consumer, r.batch = cs.one, cs.batch
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
	if id := KeyFromHeaders(msg, r.cfg.KeyHeaders...); id != "" {
		return id, nil
	}
	if r.cfg.OffsetKeyFallback {
		return OffsetKey(msg), nil
	}
	return "", fmt.Errorf("%w (looked for %q)", ErrMissingKey, r.cfg.KeyHeaders)
}

// Run joins the group and handles the messages of the partitions it is
// assigned until ctx is cancelled; then it stops its partition workers,
// commits the offsets they recorded, leaves the group and returns nil. Offsets
// whose effects did not commit are never committed; they are redelivered when
// the group next reads the partition. Errors joining the group are logged and
// retried (ReaderConfig.JoinGroupBackoff).
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("dedupekafka: Run called twice")
	}
	cg, err := kafka.NewConsumerGroup(groupConfig(r.rc, r.cfg.CommitTimeout, r.errLog))
	if err != nil {
		return fmt.Errorf("dedupekafka: %w", err)
	}
	defer cg.Close()
	for {
		gen, err := cg.Next(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, kafka.ErrGroupClosed):
			return fmt.Errorf("dedupekafka: %w", err)
		case err != nil:
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: joining the group failed; retrying", "group", r.rc.GroupID, "err", err)
			continue
		}
		done := make(chan struct{})
		gen.Start(func(gctx context.Context) {
			defer close(done)
			r.generation(ctx, gctx, gen)
			if ctx.Err() != nil {
				// Leave the group now rather than after joining the next
				// generation: Close marks the group closed, which the group's
				// loop sees before this function returns and ends the
				// generation; Next returns as soon as it is marked.
				go cg.Close()
				_, _ = cg.Next(context.Background())
			}
		})
		<-done
		if ctx.Err() != nil {
			return nil
		}
	}
}

// generation runs one generation's partition workers and committer until the
// generation ends (gctx) or the runner stops (ctx), then stops the workers
// and commits what they recorded.
func (r *Runner) generation(ctx, gctx context.Context, gen *kafka.Generation) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopWatch := context.AfterFunc(gctx, cancel)
	defer stopWatch()

	g := &genState{c: newCommitter(gen.CommitOffsets)}
	// rejoin ends the generation early (a partition vanished): the member
	// joins the next one, which reads the group's offsets again.
	g.rejoin = func(tp topicPartition) {
		g.c.ban(tp)
		g.once.Do(func() {
			r.cfg.Logger.WarnContext(ctx, "dedupekafka: a partition vanished (its topic was deleted or recreated): dropping its uncommitted offsets and rejoining the group",
				"topic", tp.topic, "partition", tp.id)
			cancel()
		})
	}
	c := g.c
	var wg sync.WaitGroup
	n := 0
	for topic, parts := range gen.Assignments {
		for _, p := range parts {
			n++
			wg.Go(func() { r.consume(wctx, topicPartition{topic, p.ID}, p.Offset, g) })
		}
	}
	r.cfg.Logger.DebugContext(ctx, "dedupekafka: generation started", "group", gen.GroupID, "generation", gen.ID, "partitions", n)
	var cwg sync.WaitGroup
	cwg.Go(func() {
		c.run(wctx, r.cfg.CommitInterval, func(n int, err error) {
			r.flushed(ctx, n, err)
			if errors.Is(err, kafka.UnknownTopicOrPartition) {
				g.once.Do(cancel)
			}
		})
	})
	<-wctx.Done()
	wg.Wait()
	cwg.Wait()
	// The generation is still ours (the member rejoins only after this
	// returns), so the broker takes these offsets before the partitions move.
	n, err := c.flush()
	r.flushed(ctx, n, err)
}

// genState is what the partition workers of one generation share.
type genState struct {
	c      *committer
	rejoin func(topicPartition)
	once   sync.Once
}

// flushed reports one flush of the committer, which committed the offsets
// of n partitions or failed.
func (r *Runner) flushed(ctx context.Context, n int, err error) {
	ctx = context.WithoutCancel(ctx)
	if err != nil {
		r.cfg.Logger.WarnContext(ctx, "dedupekafka: offset commit failed; the messages since the last commit will be redelivered and absorbed by the inbox", "err", err)
		r.groupEvent(ctx, dedupe.EventOffsetCommitFailed, err, 0)
		return
	}
	if n > 0 {
		r.groupEvent(ctx, dedupe.EventOffsetsCommitted, nil, n)
	}
}
