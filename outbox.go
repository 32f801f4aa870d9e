package dedupe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/uuid"
)

// DefaultOutboxTable is the default of Config.OutboxTable.
const DefaultOutboxTable = "dedupe_outbox"

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

// OutboxMessage is a message read back from the outbox: what a Publisher is
// given, and what operators see of a parked message.
type OutboxMessage struct {
	Message
	// Seq is the row's position in the outbox; per key it is commit order.
	Seq int64
	// Attempt is the publish attempt, starting at 1 (for a parked message:
	// the attempts made).
	Attempt int
	// CreatedAt is when the message was enqueued (the Config.Clock of the
	// enqueuing process).
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
	db       DB
	cfg      Config
	table    string
	q        outboxQueries
	lockSeed int64
	quiet    bool
}

// NewOutbox returns the outbox of cfg (nil for the defaults): the table
// Config.OutboxTable in Config.Schema, created by Migrate. db is used by the
// relay and the operator methods; Enqueue writes through the transaction it
// is given.
func NewOutbox(db DB, cfg *Config) (*Outbox, error) {
	if db == nil {
		return nil, &ConfigError{Field: "db", Reason: "must not be nil"}
	}
	return newOutbox(db, cfg)
}

func newOutbox(db DB, cfg *Config) (*Outbox, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	table := c.qualifiedTable(c.OutboxTable)
	h := fnv.New64a()
	h.Write([]byte(table))
	return &Outbox{db: db, cfg: c, table: table, q: newOutboxQueries(table), lockSeed: int64(h.Sum64())}, nil
}

// defaultOutbox serves the package-level Enqueue.
var defaultOutbox, _ = newOutbox(nil, nil)

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

// Enqueue writes msg into the default outbox (table "dedupe_outbox" on the
// search_path) inside tx, the caller's transaction; see Outbox.Enqueue.
func Enqueue(ctx context.Context, tx Querier, msg Message) (string, error) {
	return defaultOutbox.Enqueue(ctx, tx, msg)
}

// Enqueue writes msg into the outbox inside tx, the caller's transaction, and
// returns its ID. The message is published only if tx commits, and then at
// least once: a relay re-sends it if it dies before recording the broker's
// confirmation, and consumers deduplicate by the ID.
//
// Messages of one Topic and Key are published in commit order: a second
// transaction enqueueing the same key waits for the first one to end, so keep
// such transactions short.
func (o *Outbox) Enqueue(ctx context.Context, tx Querier, msg Message) (string, error) {
	if tx == nil {
		return "", &ConfigError{Field: "tx", Reason: "must not be nil"}
	}
	if msg.ID == "" {
		msg.ID = uuid.New()
	}
	if err := msg.validate(); err != nil {
		return "", err
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
		o.cfg.wallClock(), o.lockSeed); err != nil {
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
		var ke *KeyError
		if err := validatePart(field, v); errors.As(err, &ke) {
			return &MessageError{Field: field, Reason: strings.TrimPrefix(ke.Reason.Error(), "dedupe: ")}
		}
		return nil
	}
	return errors.Join(check("ID", m.ID, true), check("Topic", m.Topic, true), check("Key", m.Key, false))
}

// OutboxStats is the state of the outbox's unpublished rows.
type OutboxStats struct {
	Pending int64 // waiting to be published (including retries)
	Parked  int64 // given up on until an operator unparks them
	// OldestPending is the age of the oldest pending message, or 0.
	OldestPending time.Duration
}

// Stats counts the outbox's unpublished rows.
func (o *Outbox) Stats(ctx context.Context) (OutboxStats, error) {
	var (
		s      OutboxStats
		oldest *time.Time
	)
	if err := o.db.QueryRow(ctx, o.q.stats).Scan(&s.Pending, &s.Parked, &oldest); err != nil {
		return s, translate(err)
	}
	if oldest != nil {
		s.OldestPending = max(o.cfg.wallClock().Sub(*oldest), 0)
	}
	return s, nil
}

// Parked lists up to limit parked messages, oldest first, with the error that
// parked them. A parked message holds back the later messages of its key
// (their order is kept) until it is unparked.
func (o *Outbox) Parked(ctx context.Context, limit int) ([]*OutboxMessage, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := o.db.Query(ctx, o.q.parked, limit)
	if err != nil {
		return nil, translate(err)
	}
	msgs, err := pgx.CollectRows(rows, scanOutboxMessage)
	return msgs, translate(err)
}

// Unpark hands a parked message back to the relay with fresh attempts, after
// an operator fixed the cause. It returns ErrNotFound when no parked message
// has that ID.
func (o *Outbox) Unpark(ctx context.Context, id string) error {
	tag, err := o.db.Exec(ctx, o.q.unpark, id, o.cfg.wallClock())
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: no parked outbox message %q", ErrNotFound, id)
	}
	return nil
}

// scanOutboxMessage reads the columns of outboxColumns.
func scanOutboxMessage(row pgx.CollectableRow) (*OutboxMessage, error) {
	var (
		m       OutboxMessage
		headers []byte
		parked  *time.Time
		lastErr *string
	)
	if err := row.Scan(&m.Seq, &m.ID, &m.Topic, &m.Key, &headers, &m.Payload, &m.Attempt,
		&m.nextAt, &parked, &lastErr, &m.CreatedAt); err != nil {
		return nil, err
	}
	if headers != nil {
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			return nil, fmt.Errorf("dedupe: decode outbox headers: %w", err)
		}
	}
	if parked != nil {
		m.ParkedAt = *parked
	}
	if lastErr != nil {
		m.LastError = *lastErr
	}
	return &m, nil
}
