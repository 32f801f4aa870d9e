package dedupewatermill

import (
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// Config configures a Middleware.
type Config struct {
	// Scope is the namespace of the keys in the inbox: the consuming
	// service or handler. Required.
	Scope string
	// Key extracts a message's dedup key. Defaults to UUIDKey.
	Key func(msg *message.Message) (string, error)
	// Fingerprint optionally hashes the payload; a redelivery under the same
	// key with another fingerprint is refused as a conflict. Defaults to
	// none.
	Fingerprint func(msg *message.Message) []byte
	// IsoLevel is the transaction's isolation level. Defaults to the
	// database default (read committed).
	IsoLevel pgx.TxIsoLevel
	// LockTimeout bounds how long a handling waits for a concurrent
	// transaction holding the same key before it is nacked. Defaults to 0
	// (wait).
	LockTimeout time.Duration
	// MaxAttempts is how many failed attempts a message gets before it is
	// poison. Defaults to the inbox's Config.MaxAttempts; negative means no
	// limit.
	MaxAttempts int
	// ReturnPoison makes a poison or refused message's handling return an
	// error matching ErrPoison, for Watermill's poison-queue middleware, once
	// its key is recorded failed. Defaults to false: it is acknowledged.
	ReturnPoison bool
	// Outbox, when set, receives the messages the handler returns, in the
	// handler's transaction. Defaults to nil (the router publishes them).
	Outbox *outbox.Outbox
	// OutboxTopic is the topic of the messages written to Outbox. Defaults
	// to the handler's publish topic.
	OutboxTopic string
	// Logger receives the middleware's logs. Defaults to the inbox's logger.
	Logger *slog.Logger
}

func (c Config) withDefaults(inbox *dedupe.Inbox) (Config, error) {
	out := c
	if out.Key == nil {
		out.Key = UUIDKey
	}
	if out.Logger == nil {
		out.Logger = inbox.Config().Logger
	}
	switch {
	case out.Scope == "":
		return out, &dedupe.ConfigError{Field: "Scope", Reason: "is required"}
	case out.LockTimeout < 0:
		return out, &dedupe.ConfigError{Field: "LockTimeout", Reason: "must not be negative"}
	}
	return out, nil
}
