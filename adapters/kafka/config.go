package dedupekafka

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// Defaults of Config.
const (
	DefaultBatchSize        = 1
	DefaultBatchHandlerSize = 100
	DefaultLinger           = 5 * time.Millisecond
	DefaultRetryBackoff     = 100 * time.Millisecond
	DefaultMaxRetryBackoff  = 5 * time.Second
	DefaultCommitTimeout    = 10 * time.Second
)

// DefaultKeyHeaders are the headers looked up, in order, for a message's key.
var DefaultKeyHeaders = []string{"Idempotency-Key", "message-id"}

// HandlerFunc processes one message inside tx, the transaction that also holds
// its claim (and, in batch mode, the claims and effects of the other new
// messages of its batch). Write the effects through tx. Return an error to roll
// back; wrap it with dedupe.Permanent when retrying cannot help.
type HandlerFunc = dedupe.HandlerFunc[kafka.Message]

// BatchHandlerFunc processes the new messages of one batch (of one
// partition, in offset order) inside tx, the transaction that holds their
// claims, so that it can write all their effects with a few statements (an
// unnest insert, COPY). Duplicates of the batch are left out. If it fails,
// the batch is rolled back and each of its messages is handled again alone,
// with a one-message slice, in its own transaction.
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error

// Reader is the part of *kafka.Reader the Runner uses. Pass a *kafka.Reader
// configured with a GroupID; the interface lets a caller wrap it (metrics,
// tracing).
type Reader interface {
	FetchMessage(ctx context.Context) (kafka.Message, error)
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
	Config() kafka.ReaderConfig
}

// Writer is the part of *kafka.Writer the dead-letter path uses.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Config configures a Runner. The zero value is usable.
type Config struct {
	// Scope is the namespace of the keys in the inbox. Defaults to the
	// reader's GroupID.
	Scope string
	// KeyHeaders are the message headers whose first non-empty value is the
	// message's dedup key; names match case-insensitively. A message with none
	// of them is keyed by "topic/partition/offset", which dedups broker
	// redeliveries but not a producer that sent the same thing twice.
	// Defaults to DefaultKeyHeaders ("Idempotency-Key", then "message-id").
	KeyHeaders []string
	// Key, when set, replaces the header lookup entirely. Defaults to nil.
	Key func(msg kafka.Message) (string, error)
	// Fingerprint optionally hashes the payload (see dedupe.Key.Fingerprint).
	// Defaults to nil (no fingerprint).
	Fingerprint func(msg kafka.Message) []byte
	// BatchSize is how many messages of one partition are claimed with one
	// statement and handled in one transaction. 1 is per-message mode (one
	// transaction and one offset commit per message). Defaults to 1 for New
	// and to DefaultBatchHandlerSize (100) for NewBatch.
	BatchSize int
	// Linger is how long a partition worker waits for more messages to fill a
	// batch once it has at least one. Only used when BatchSize > 1. Defaults
	// to 5ms.
	Linger time.Duration
	// MaxAttempts is how many failed attempts a message gets before its key is
	// marked failed, it is dead-lettered and its offset committed. Defaults to
	// the inbox's Config.MaxAttempts; negative means no limit.
	MaxAttempts int
	// RetryBackoff is the first delay before a failed message is tried again
	// (its partition waits; Kafka has no per-message redelivery). It doubles
	// per attempt up to MaxRetryBackoff. Defaults to 100ms.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the retry delay. Defaults to 5s.
	MaxRetryBackoff time.Duration
	// CommitTimeout bounds one CommitMessages call, which runs even while the
	// Runner shuts down so that committed effects are not redelivered
	// needlessly. Defaults to 10s.
	CommitTimeout time.Duration
	// DeadLetter, when set, receives every message given up on (poisoned, or
	// a key conflict or an unusable key) with headers naming the origin and
	// the error, before its offset is committed. Use a synchronous writer
	// (kafka.Writer with Async false) and a topic other than the consumed one.
	// Defaults to nil (the message is recorded failed in the inbox and logged).
	DeadLetter Writer
	// IsoLevel is the isolation level of the transactions. Defaults to the
	// database default (read committed).
	IsoLevel pgx.TxIsoLevel
	// Logger receives the runner's logs. Defaults to the inbox's logger.
	Logger *slog.Logger
}

func (c Config) withDefaults(inbox *dedupe.Inbox, r Reader) (Config, error) {
	rc := r.Config()
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
		c.MaxRetryBackoff = DefaultMaxRetryBackoff
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = DefaultCommitTimeout
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
	case c.CommitTimeout < 0:
		return c, &dedupe.ConfigError{Field: "CommitTimeout", Reason: "must be positive"}
	}
	if err := (dedupe.Key{Scope: c.Scope, ID: "x"}).Validate(); err != nil {
		return c, &dedupe.ConfigError{Field: "Scope", Reason: err.Error()}
	}
	return c, nil
}
