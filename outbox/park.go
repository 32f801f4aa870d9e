package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// A parked message is one the relay gave up on: its error was Permanent, or
// it failed RelayConfig.MaxAttempts times while the broker took other
// messages. It stays pending and holds back the later messages of its key,
// so their order is never given up silently, until an operator decides:
// Unpark retries it, Discard drops it for good.

// Parked lists up to limit parked messages, oldest first, with the error that
// parked them.
func (o *Outbox) Parked(ctx context.Context, limit int) ([]*StoredMessage, error) {
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
// an operator fixed the cause. It returns dedupe.ErrNotFound when no parked message
// has that ID.
func (o *Outbox) Unpark(ctx context.Context, id string) error {
	tag, err := o.db.Exec(ctx, o.q.unpark, id, o.dbNow())
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: no parked outbox message %q", dedupe.ErrNotFound, id)
	}
	return nil
}

// DiscardedMessage is a message an operator discarded, with the record kept
// in its row.
type DiscardedMessage struct {
	StoredMessage
	// DiscardedAt is when it was discarded, on the database's clock.
	DiscardedAt time.Time
	// DiscardedBy and DiscardReason are who discarded it and why, as given
	// to Discard.
	DiscardedBy, DiscardReason string
}

// Discard drops a parked message for good, so that the later messages of
// its key, which it held back, are published: the way to unblock a key on
// purpose when the message must never go out (or was sent by other means).
// by (who decides) and reason (why) are required; they are stored in the
// row with the time, and logged at warning level. The row leaves the pending
// rows and is deleted after the relay's Retention, like a published one; its
// ID stays known to Enqueue until then.
//
// It returns dedupe.ErrNotFound when no parked message has that ID (it was never
// parked, was unparked, published or discarded already).
func (o *Outbox) Discard(ctx context.Context, id, by, reason string) (*DiscardedMessage, error) {
	switch {
	case by == "":
		return nil, &dedupe.ConfigError{Field: "by", Reason: "must name who discards the message"}
	case reason == "":
		return nil, &dedupe.ConfigError{Field: "reason", Reason: "must say why the message is discarded"}
	}
	var (
		r  outboxRow
		at time.Time
	)
	err := o.db.QueryRow(ctx, o.q.discard, id, by, reason, o.dbNow()).Scan(append(r.fields(), &at)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: no parked outbox message %q", dedupe.ErrNotFound, id)
	}
	if err != nil {
		return nil, translate(err)
	}
	m, err := r.message()
	if err != nil {
		return nil, err
	}
	o.cfg.Logger.WarnContext(ctx, "dedupe: outbox message discarded", "id", m.ID, "topic", m.Topic, "key", m.Key,
		"attempts", m.Attempt, "last_error", m.LastError, "by", by, "reason", reason, "at", at)
	if obs := o.cfg.Observer; obs != nil {
		obs.Discarded(ctx, m, by, reason)
	}
	return &DiscardedMessage{StoredMessage: *m, DiscardedAt: at, DiscardedBy: by, DiscardReason: reason}, nil
}
