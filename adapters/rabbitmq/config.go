package dedupeamqp

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
)

// Defaults of Config.
const (
	DefaultWorkers       = 4
	DefaultMinPrefetch   = 8
	DefaultAckTimeout    = 5 * time.Second
	DefaultDrainTimeout  = 10 * time.Second
	DefaultBackoffBase   = 100 * time.Millisecond
	DefaultBackoffMax    = 30 * time.Second
	DefaultInFlightDelay = time.Second
	DefaultDialTimeout   = 10 * time.Second
)

// DefaultReconnect is the default Config.Reconnect.
var DefaultReconnect = dedupe.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}

// Config configures a Runner. The zero value is usable.
type Config struct {
	// Scope is the namespace of the keys in the inbox. Defaults to the queue
	// name.
	Scope string
	// Key extracts a message's dedup key. Defaults to DefaultKey (the
	// message_id property); HeaderKey reads a header.
	Key func(d amqp.Delivery) (string, error)
	// Fingerprint optionally hashes the payload; a redelivery under the same
	// key with another fingerprint is refused as a conflict. Defaults to none.
	Fingerprint func(d amqp.Delivery) []byte
	// IsoLevel is the transaction's isolation level. Defaults to the
	// database default (read committed).
	IsoLevel pgx.TxIsoLevel
	// LockTimeout bounds how long a worker waits for a concurrent
	// transaction holding the same key before it requeues the message as in
	// flight. Defaults to 0 (wait).
	LockTimeout time.Duration
	// MaxAttempts is how many failed attempts a message gets before it is
	// poison. Defaults to the inbox's Config.MaxAttempts, capped at
	// DeliveryLimit+1 when that is set; negative means no limit. It must not
	// exceed DeliveryLimit+1.
	MaxAttempts int
	// Workers is the number of deliveries handled concurrently. Defaults
	// to 4.
	Workers int
	// Prefetch is the channel's basic.qos prefetch count: how many
	// unacknowledged deliveries the broker sends this runner, the ones held
	// for a retry's delay included. Defaults to max(2×Workers, 8). At most
	// 65535.
	Prefetch int
	// Backoff gives the delay before a message is requeued after its
	// attempt-th failed attempt, and between tries while the database is
	// unreachable. Defaults to
	// dedupe.Backoff{Min: 100ms, Max: 30s, Jitter: 0.2}.Delay.
	Backoff func(attempt int) time.Duration
	// InFlightDelay is the delay before a message is requeued when a
	// concurrent attempt holds its key. Defaults to 1s.
	InFlightDelay time.Duration
	// DeliveryLimit is the queue's x-delivery-limit (a quorum queue's), 0
	// when it has none. A delivery whose x-delivery-count reaches it is the
	// last one the broker makes: the runner records it rather than requeue
	// it (see the package documentation).
	DeliveryLimit int
	// DeadLetterExchange, when set, receives a copy of each message the
	// runner dead-letters (poison, refused, given up at its last delivery),
	// published with publisher confirms and the mandatory flag before the
	// delivery is acked. Without it a dead-lettered delivery is rejected
	// without requeue, to the queue's own x-dead-letter-exchange. The
	// default exchange is "" and cannot be named here; use
	// DeadLetterRoutingKey with DeadLetterExchange "amq.direct" or an
	// exchange of your own.
	DeadLetterExchange string
	// DeadLetterRoutingKey is the routing key of the copies. Defaults to the
	// queue name.
	DeadLetterRoutingKey string
	// AckTimeout bounds a dead-letter publish and its confirm, and one try
	// to record a message as failed. Defaults to 5s.
	AckTimeout time.Duration
	// DrainTimeout is how long in-flight handlers may run on after Run's
	// context is cancelled before their transactions are cancelled and
	// rolled back. Defaults to 10s.
	DrainTimeout time.Duration
	// Reconnect is the backoff between attempts to connect and consume.
	// Defaults to DefaultReconnect.
	Reconnect dedupe.Backoff
	// ConsumerTag is the consumer's tag on its channel. Defaults to one the
	// broker generates.
	ConsumerTag string
	// AMQP is the connection's configuration (credentials from the URL,
	// heartbeat, TLS, properties). Its Recovery must be nil: the runner
	// reconnects itself. Its Dial defaults to amqp.DefaultDial(10s).
	AMQP amqp.Config
	// Logger receives the runner's logs. Defaults to the inbox's logger.
	Logger *slog.Logger
}

// withDefaults fills the zero fields of a copy of c for queue and
// validates it.
func (c Config) withDefaults(inbox *dedupe.Inbox, queue string) (Config, error) {
	out := c
	bad := func(field, reason string) (Config, error) {
		return out, &dedupe.ConfigError{Field: field, Reason: reason}
	}
	if out.Scope == "" {
		out.Scope = queue
	}
	if out.Key == nil {
		out.Key = DefaultKey
	}
	if out.Workers == 0 {
		out.Workers = DefaultWorkers
	}
	if out.Prefetch == 0 {
		out.Prefetch = max(2*out.Workers, DefaultMinPrefetch)
	}
	if out.Backoff == nil {
		out.Backoff = dedupe.Backoff{Min: DefaultBackoffBase, Max: DefaultBackoffMax, Jitter: 0.2}.Delay
	}
	if out.InFlightDelay == 0 {
		out.InFlightDelay = DefaultInFlightDelay
	}
	if out.AckTimeout == 0 {
		out.AckTimeout = DefaultAckTimeout
	}
	if out.DrainTimeout == 0 {
		out.DrainTimeout = DefaultDrainTimeout
	}
	if out.Reconnect == (dedupe.Backoff{}) {
		out.Reconnect = DefaultReconnect
	}
	if out.DeadLetterRoutingKey == "" {
		out.DeadLetterRoutingKey = queue
	}
	if out.AMQP.Dial == nil {
		out.AMQP.Dial = amqp.DefaultDial(DefaultDialTimeout)
	}
	if out.Logger == nil {
		out.Logger = inbox.Config().Logger
	}
	if out.DeliveryLimit > 0 {
		limit := out.DeliveryLimit + 1 // deliveries the broker makes
		inboxMax := inbox.Config().MaxAttempts
		switch {
		case out.MaxAttempts == 0 && (inboxMax < 0 || inboxMax > limit):
			out.MaxAttempts = limit
		case out.MaxAttempts < 0 || out.MaxAttempts > limit:
			return bad("MaxAttempts", fmt.Sprintf(
				"must not exceed DeliveryLimit+1 (%d): the broker would stop delivering before the key is marked failed", limit))
		}
	}
	switch {
	case queue == "":
		return bad("queue", "is required")
	case out.Workers < 0:
		return bad("Workers", "must be positive")
	case out.Prefetch < out.Workers || out.Prefetch > 65535:
		return bad("Prefetch", "must be at least Workers and at most 65535")
	case out.DeliveryLimit < 0:
		return bad("DeliveryLimit", "must not be negative")
	case out.AMQP.Recovery != nil:
		return bad("AMQP.Recovery", "must be nil: a recovered channel reuses delivery tags, and the runner reconnects itself")
	case out.InFlightDelay < 0 || out.AckTimeout < 0 || out.DrainTimeout < 0:
		return bad("delays", "must not be negative")
	}
	return out, nil
}
