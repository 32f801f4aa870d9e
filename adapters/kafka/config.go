package dedupekafka

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// Defaults of Config.
const (
	DefaultBatchSize          = 1
	DefaultBatchHandlerSize   = 100
	DefaultLinger             = 5 * time.Millisecond
	DefaultRetryBackoff       = 100 * time.Millisecond
	DefaultMaxRetryBackoff    = 5 * time.Second
	DefaultCommitInterval     = time.Second
	DefaultCommitTimeout      = 10 * time.Second
	DefaultDeadLetterAttempts = 5
)

// DefaultKeyHeaders are the headers looked up, in order, for a message's key.
var DefaultKeyHeaders = []string{"Idempotency-Key", "message-id"}

// HandlerFunc processes one message inside tx, the transaction that also holds
// its claim (and, in batch mode, the claims and effects of the other new
// messages of its batch). Write the effects through tx. Return an error to roll
// back; wrap it with dedupe.Permanent when retrying cannot help. ctx ends when
// the runner stops or the partition is revoked: return promptly then.
//
// HandlerFunc is the handler of an inbox over pgx; New also takes a
// dedupe.TxHandlerFunc[*sql.Tx, kafka.Message] for an inbox over dedupe.SQL.
type HandlerFunc = dedupe.TxHandlerFunc[pgx.Tx, kafka.Message]

// BatchHandlerFunc processes the new messages of one batch (of one
// partition, in offset order) inside tx, the transaction that holds their
// claims, so that it can write all their effects with a few statements (an
// unnest insert, COPY). Duplicates of the batch are left out. If it fails,
// the batch is rolled back and each of its messages is handled again alone,
// with a one-message slice, in its own transaction.
//
// BatchHandlerFunc is the batch handler of an inbox over pgx; NewBatch also
// takes a dedupe.TxBatchHandlerFunc[*sql.Tx, kafka.Message] for an inbox over
// dedupe.SQL.
type BatchHandlerFunc = dedupe.TxBatchHandlerFunc[pgx.Tx, kafka.Message]

// Writer is the part of *kafka.Writer the dead-letter path uses.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Config configures a Runner. The zero value is usable.
type Config struct {
	// Scope is the namespace of the keys in the inbox. Defaults to the
	// reader configuration's GroupID.
	Scope string
	// KeyHeaders are the message headers whose first non-empty value is the
	// message's dedup key; names match case-insensitively. A message with none
	// of them is refused (ErrMissingKey): it is recorded failed in the inbox
	// under RefusedKey and dead-lettered, never handled under a guessed key,
	// unless OffsetKeyFallback is set. Defaults to DefaultKeyHeaders
	// ("Idempotency-Key", then "message-id").
	KeyHeaders []string
	// OffsetKeyFallback keys a message that has none of the KeyHeaders by its
	// broker position, "topic/partition/offset" (OffsetKey). That dedups
	// broker redeliveries but not a producer that sent the same event twice,
	// and it is only safe while the topic is never deleted and recreated:
	// offsets restart with a new topic, so its new messages would take the
	// keys of old ones and be dropped as duplicates. Defaults to false.
	OffsetKeyFallback bool
	// Key, when set, replaces the header lookup (and OffsetKeyFallback)
	// entirely; an error refuses the message as ErrMissingKey does. Defaults
	// to nil.
	Key func(msg kafka.Message) (string, error)
	// Fingerprint optionally hashes the payload (see dedupe.Key.Fingerprint).
	// Defaults to nil (no fingerprint).
	Fingerprint func(msg kafka.Message) []byte
	// BatchSize is how many messages of one partition are claimed with one
	// statement and handled in one transaction. 1 is per-message mode (one
	// transaction per message). Defaults to 1 for New and to
	// DefaultBatchHandlerSize (100) for NewBatch.
	BatchSize int
	// Linger is how long a partition waits for more messages to fill a
	// batch once it has at least one. Only used when BatchSize > 1. Defaults
	// to 5ms.
	Linger time.Duration
	// MaxAttempts is how many failed attempts a message gets before its key is
	// marked failed, it is dead-lettered and its offset committed. Defaults to
	// the inbox's Config.MaxAttempts; negative means no limit.
	MaxAttempts int
	// RetryBackoff is the first delay before a failed message (or dead-letter
	// write) is tried again; its partition waits, the others do not. It
	// doubles per attempt up to MaxRetryBackoff. Defaults to 100ms.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the retry delay. Defaults to 5s.
	MaxRetryBackoff time.Duration
	// CommitInterval is how often the highest offset each partition has
	// committed to the database is committed to the group, in one request for
	// all partitions. Offsets are also committed when partitions are revoked
	// and when the runner stops. A crash loses at most this much offset
	// progress; the redeliveries it causes are absorbed by the inbox.
	// Defaults to 1s.
	CommitInterval time.Duration
	// CommitTimeout bounds each request to the group coordinator, offset
	// commits included (kafka.ConsumerGroupConfig.Timeout). Defaults to 10s.
	CommitTimeout time.Duration
	// DeadLetter, when set, receives every message given up on (poisoned, a
	// key conflict, or no usable key) with headers naming the origin and the
	// error, before its offset is committed. It must be synchronous and
	// durable: a *kafka.Writer must have a Topic other than the consumed ones,
	// RequiredAcks kafka.RequireAll and Async false (ErrInvalidConfig
	// otherwise). Defaults to nil: the message stays visible as a failed key
	// in the inbox (its own key, or RefusedKey) and in the log.
	DeadLetter Writer
	// DeadLetterAttempts is how many times one message's dead-letter write is
	// tried, with backoff, before its partition pauses: the partition stops
	// (the others go on), the error is logged and reported to the inbox's
	// Observer (dedupe.EventPartitionPaused), and the message's offset stays
	// uncommitted, so the partition's next owner (after a rebalance or
	// restart) tries again. Defaults to 5.
	DeadLetterAttempts int
	// IsoLevel is the isolation level of the transactions. Defaults to the
	// database default (read committed).
	IsoLevel pgx.TxIsoLevel
	// Logger receives the runner's logs, and kafka-go's error logs. Defaults
	// to the inbox's logger. For metrics and traces, set the inbox's
	// Observer: it is told of every handling and of what the runner did
	// beyond it (dedupe.TransportEvent).
	Logger *slog.Logger
}

func (c Config) withDefaults(inbox *dedupe.Inbox, rc kafka.ReaderConfig) (Config, error) {
	if rc.GroupID == "" {
		return c, ErrNoGroup
	}
	if c.Scope == "" {
		c.Scope = rc.GroupID
	}
	if len(c.KeyHeaders) == 0 && c.Key == nil {
		c.KeyHeaders = DefaultKeyHeaders
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.MaxRetryBackoff == 0 {
		c.MaxRetryBackoff = max(DefaultMaxRetryBackoff, c.RetryBackoff)
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = DefaultCommitTimeout
	}
	if c.DeadLetterAttempts == 0 {
		c.DeadLetterAttempts = DefaultDeadLetterAttempts
	}
	if c.Logger == nil {
		c.Logger = inbox.Config().Logger
	}
	switch {
	case c.BatchSize < 0:
		return c, &dedupe.ConfigError{Field: "BatchSize", Reason: "must be positive"}
	case c.Linger < 0:
		return c, &dedupe.ConfigError{Field: "Linger", Reason: "must not be negative"}
	case c.RetryBackoff < 0:
		return c, &dedupe.ConfigError{Field: "RetryBackoff", Reason: "must not be negative"}
	case c.MaxRetryBackoff < c.RetryBackoff:
		return c, &dedupe.ConfigError{Field: "MaxRetryBackoff", Reason: "must be at least RetryBackoff"}
	case c.CommitInterval < 0:
		return c, &dedupe.ConfigError{Field: "CommitInterval", Reason: "must be positive"}
	case c.CommitTimeout < 0:
		return c, &dedupe.ConfigError{Field: "CommitTimeout", Reason: "must be positive"}
	case c.DeadLetterAttempts < 0:
		return c, &dedupe.ConfigError{Field: "DeadLetterAttempts", Reason: "must be positive"}
	}
	if err := (dedupe.Key{Scope: c.Scope, ID: "x"}).Validate(); err != nil {
		return c, &dedupe.ConfigError{Field: "Scope", Reason: err.Error()}
	}
	if w, ok := c.DeadLetter.(*kafka.Writer); ok {
		switch {
		case w == nil:
			return c, &dedupe.ConfigError{Field: "DeadLetter", Reason: "is a nil *kafka.Writer"}
		case w.Async:
			return c, &dedupe.ConfigError{Field: "DeadLetter.Async", Reason: "must be false: an asynchronous write returns before the dead letter is durable, and the offset would be committed without it"}
		case w.RequiredAcks != kafka.RequireAll:
			return c, &dedupe.ConfigError{Field: "DeadLetter.RequiredAcks", Reason: "must be kafka.RequireAll: the dead letter is the only copy once the offset is committed"}
		case w.Topic == "":
			return c, &dedupe.ConfigError{Field: "DeadLetter.Topic", Reason: "must name the dead-letter topic"}
		case slices.Contains(groupTopics(rc), w.Topic):
			return c, &dedupe.ConfigError{Field: "DeadLetter.Topic", Reason: "must not be a consumed topic"}
		}
	}
	return c, nil
}

// retryBackoff is the backoff of a partition's retries: RetryBackoff
// doubling up to MaxRetryBackoff.
func (c *Config) retryBackoff() dedupe.Backoff {
	return dedupe.Backoff{Min: c.RetryBackoff, Max: c.MaxRetryBackoff}
}
