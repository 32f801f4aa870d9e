package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/corelink"
	"github.com/exactlyonce/dedupe/internal/uuid"
)

// DefaultTable is the default of Config.Table.
const DefaultTable = dedupe.DefaultOutboxTable

// Config configures an Outbox. The zero value is usable: every field
// has a default.
type Config struct {
	// Schema holds the outbox table. Defaults to "" (the connection's
	// search_path).
	Schema string
	// Table is the outbox table's name. Defaults to "dedupe_outbox".
	Table string
	// CleanupBatchSize bounds the published rows deleted per statement by a
	// relay's retention cleanup. Defaults to 1000.
	CleanupBatchSize int
	// Clock is a test seam, as dedupe.Config.Clock: when set, its time stands in
	// for the database's clock in every enqueue, retry, parking and
	// retention decision. Defaults to nil (the database's clock).
	Clock func() time.Time
	// Logger receives the outbox's logs, and its relays' unless
	// RelayConfig.Logger is set. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer is told of every enqueue, publish and discard, and its
	// relays' unless RelayConfig.Observer is set. Defaults to nil.
	Observer Observer
}

// withDefaults returns a copy of c with every zero field defaulted, or a
// *dedupe.ConfigError.
func (c Config) withDefaults() (Config, error) {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.CleanupBatchSize == 0 {
		c.CleanupBatchSize = dedupe.DefaultPurgeBatchSize
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case len(c.Table) > 48:
		return c, &dedupe.ConfigError{Field: "Table", Reason: "must be at most 48 bytes (PostgreSQL truncates longer names)"}
	case c.CleanupBatchSize < 0:
		return c, &dedupe.ConfigError{Field: "CleanupBatchSize", Reason: "must be positive"}
	}
	return c, nil
}

// Migration returns the migration configuration of the outbox's table: its
// schema and table, the outbox line only.
func (c Config) Migration() dedupe.MigrateConfig {
	return dedupe.MigrateConfig{Schema: c.Schema, OutboxTable: c.Table, Lines: []dedupe.Line{dedupe.LineOutbox}}
}

// now is the "now" parameter of every statement that decides by time: nil
// (SQL then takes the database's clock) unless Clock is set.
func (c *Config) now() *time.Time {
	if c.Clock == nil {
		return nil
	}
	t := c.Clock()
	return &t
}

// translate maps a database error to the root's sentinel errors
// (ErrNotMigrated ...), as the inbox does.
func translate(err error) error { return corelink.Translate(err) }

// qualify quotes the table name, qualified by schema when it is set.
func qualify(schema, name string) string {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// Message is one message to publish through the transactional outbox.
type Message struct {
	// ID identifies the message to its consumers: the JetStream publisher
	// sends it as the Nats-Msg-Id header (so the stream's duplicate window
	// drops a relay's re-send) and the Kafka publisher as the message-id
	// header, for the downstream inbox to claim. Enqueueing an ID that is
	// still in the outbox writes nothing. At most 255 bytes. Defaults to a
	// new random UUID.
	ID string
	// Topic is where the message goes: the JetStream subject or the Kafka
	// topic. Required; at most 255 bytes.
	Topic string
	// Key orders messages: those with the same Topic and Key are published
	// in commit order, one at a time. The Kafka publisher also uses it as
	// the message key (partitioning). At most 255 bytes. Defaults to "" (no
	// order with other messages).
	Key string
	// Headers travel with the message. Defaults to none.
	Headers map[string][]string
	// Payload is the message body. Defaults to empty.
	Payload []byte
}

// StoredMessage is a message read back from the outbox: what a Publisher is
// given, and what operators see of a parked message.
type StoredMessage struct {
	Message
	// Seq is the row's position in the outbox; per key it is commit order.
	Seq int64
	// Attempt is the publish attempt, starting at 1 (for a parked message:
	// the attempts made).
	Attempt int
	// CreatedAt is when the message was enqueued, on the database's clock.
	CreatedAt time.Time
	// LastError is the error of the last failed attempt.
	LastError string
	// ParkedAt is when the message was parked, or zero.
	ParkedAt time.Time
	nextAt   time.Time
}

// Outbox writes messages into the outbox table in the caller's transaction,
// for a Relay to publish after commit. It is safe for concurrent use.
type Outbox struct {
	db       dedupe.DB
	drv      corelink.Driver
	cfg      Config
	table    string
	q        outboxQueries
	lockSeed int64
	quiet    bool
}

// New returns the outbox of cfg (the zero Config for the
// defaults): the table Config.Table in Config.Schema, created by
// Migrate. db is used by the relay and the operator methods; Enqueue writes
// through the transaction it is given.
//
// Every time the outbox and its relays store or compare (enqueue and retry
// times, backoff, parking, retention, lag) is the database's clock when the
// statement runs, never the application's. Config.Clock, when set,
// replaces the database's clock: a seam for tests.
func New(db dedupe.DB, cfg Config) (*Outbox, error) {
	drv, err := corelink.NewDriver(db)
	if err != nil {
		return nil, err
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	table := qualify(c.Schema, c.Table)
	h := fnv.New64a()
	h.Write([]byte(table))
	return &Outbox{db: db, drv: drv, cfg: c, table: table, q: newOutboxQueries(table), lockSeed: int64(h.Sum64())}, nil
}

// NewFor returns the outbox beside inbox, in one place with it: on the
// inbox's DB, and with the settings an inbox and an outbox share taken from
// the inbox's Config wherever cfg leaves them zero: Schema, Clock, Logger,
// and Observer when the inbox's Observer implements this package's
// Observer too (as dedupeotel's does). Set them once, on the inbox; a field
// set in cfg wins. Table is the outbox's own (defaults to "dedupe_outbox").
func NewFor(inbox *dedupe.Inbox, cfg Config) (*Outbox, error) {
	if inbox == nil {
		return nil, &dedupe.ConfigError{Field: "inbox", Reason: "must not be nil"}
	}
	ic := inbox.Config()
	if cfg.Schema == "" {
		cfg.Schema = ic.Schema
	}
	if cfg.Clock == nil {
		cfg.Clock = ic.Clock
	}
	if cfg.Logger == nil {
		cfg.Logger = ic.Logger
	}
	if o, ok := ic.Observer.(Observer); ok && cfg.Observer == nil {
		cfg.Observer = o
	}
	return New(inbox.DB(), cfg)
}

// Config returns the outbox's configuration with defaults filled in.
func (o *Outbox) Config() Config { return o.cfg }

// WithoutNotify returns a copy of the outbox whose Enqueue sends no NOTIFY,
// so relays find its messages by polling only (RelayConfig.PollInterval).
// PostgreSQL serializes the commits of all transactions that sent a NOTIFY
// in a database; where commit throughput matters more than publish latency,
// this lifts that limit (see the benchmark in adapters/nats).
func (o *Outbox) WithoutNotify() *Outbox {
	c := *o
	c.quiet = true
	return &c
}

// Enqueue writes msg into the outbox inside tx, the caller's transaction, and
// returns its ID. The message is published only if tx commits, and then at
// least once: a relay re-sends it if it dies before recording the broker's
// confirmation, and consumers deduplicate by the ID.
//
// Messages of one Topic and Key are published in commit order: a second
// transaction enqueueing the same key waits for the first one to end, so keep
// such transactions short.
func (o *Outbox) Enqueue(ctx context.Context, tx dedupe.Querier, msg Message) (string, error) {
	if tx == nil {
		return "", &dedupe.ConfigError{Field: "tx", Reason: "must not be nil"}
	}
	if msg.ID == "" {
		msg.ID = uuid.New()
	}
	if err := msg.validate(); err != nil {
		return "", err
	}
	if obs := o.cfg.Observer; obs != nil {
		// The Observer may add the trace context to the headers.
		msg.Headers = maps.Clone(msg.Headers)
		if msg.Headers == nil {
			msg.Headers = map[string][]string{}
		}
		obs.Enqueued(ctx, &msg)
		if len(msg.Headers) == 0 {
			msg.Headers = nil
		}
	}
	var headers []byte
	if msg.Headers != nil {
		var err error
		if headers, err = json.Marshal(msg.Headers); err != nil {
			return "", &MessageError{Field: "Headers", Reason: err.Error()}
		}
	}
	payload := msg.Payload
	if payload == nil {
		payload = []byte{}
	}
	q := o.q.enqueue
	if o.quiet {
		q = o.q.enqueueQuiet
	}
	if _, err := tx.Exec(ctx, q, msg.ID, msg.Topic, msg.Key, headers, payload,
		o.dbNow(), o.lockSeed); err != nil {
		return "", translate(err)
	}
	return msg.ID, nil
}

// validate checks the fields Enqueue stores with the rules of keys (see
// Key.Validate); Key may be empty.
func (m *Message) validate() error {
	check := func(field, v string, required bool) error {
		if v == "" && !required {
			return nil
		}
		var ke *dedupe.KeyError
		if err := corelink.ValidatePart(field, v); errors.As(err, &ke) {
			return &MessageError{Field: field, Reason: strings.TrimPrefix(ke.Reason.Error(), "dedupe: ")}
		}
		return nil
	}
	return errors.Join(check("ID", m.ID, true), check("Topic", m.Topic, true), check("Key", m.Key, false))
}

// Stats is the state of the outbox's unpublished rows.
type Stats struct {
	Pending int64 // waiting to be published (including retries)
	Parked  int64 // given up on until an operator unparks or discards them
	// OldestPending is the age of the oldest pending message on the
	// database's clock, or 0.
	OldestPending time.Duration
}

// Stats counts the outbox's unpublished rows.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	var (
		s      Stats
		oldest *float64
	)
	if err := o.db.QueryRow(ctx, o.q.stats, o.dbNow()).Scan(&s.Pending, &s.Parked, &oldest); err != nil {
		return s, translate(err)
	}
	if oldest != nil {
		s.OldestPending = max(fromSeconds(*oldest), 0)
	}
	return s, nil
}

// scanOutboxMessage reads the columns of outboxColumns.
func scanOutboxMessage(row pgx.CollectableRow) (*StoredMessage, error) {
	var r outboxRow
	if err := row.Scan(r.fields()...); err != nil {
		return nil, err
	}
	return r.message()
}

// outboxRow holds the columns of outboxColumns as scanned, NULLs included.
type outboxRow struct {
	seq                    *int64
	id, topic, key         *string
	headers, payload       []byte
	attempts               *int
	nextAt, parked, create *time.Time
	lastErr                *string
}

// fields are the scan targets of outboxColumns.
func (r *outboxRow) fields() []any {
	return []any{&r.seq, &r.id, &r.topic, &r.key, &r.headers, &r.payload, &r.attempts,
		&r.nextAt, &r.parked, &r.lastErr, &r.create}
}

// message returns the row's message, or nil for a row of NULLs.
func (r *outboxRow) message() (*StoredMessage, error) {
	if r.seq == nil {
		return nil, nil
	}
	m := &StoredMessage{Message: Message{ID: *r.id, Topic: *r.topic, Key: *r.key, Payload: r.payload},
		Seq: *r.seq, Attempt: *r.attempts, nextAt: *r.nextAt, CreatedAt: *r.create}
	if r.parked != nil {
		m.ParkedAt = *r.parked
	}
	if r.lastErr != nil {
		m.LastError = *r.lastErr
	}
	if r.headers != nil {
		if err := json.Unmarshal(r.headers, &m.Headers); err != nil {
			return nil, fmt.Errorf("dedupe: decode outbox headers: %w", err)
		}
	}
	return m, nil
}
