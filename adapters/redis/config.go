package deduperedis

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// Defaults of Config.
const (
	DefaultWorkers = 4
	// DefaultMinPending is the least MaxPending defaults to.
	DefaultMinPending    = 64
	DefaultClaimIdle     = 30 * time.Second
	DefaultMaxDeliveries = 20
	DefaultBlock         = time.Second
	DefaultAckTimeout    = 5 * time.Second
	DefaultDrainTimeout  = 10 * time.Second
	DefaultBackoffBase   = 100 * time.Millisecond
	DefaultBackoffMax    = 30 * time.Second
	DefaultInFlightDelay = time.Second
	// DefaultStartID is where a missing group is created: the stream's
	// first entry.
	DefaultStartID = "0"
)

// Config configures a Runner. The zero value is usable.
type Config struct {
	// Scope is the namespace of the keys in the inbox. Defaults to the
	// group's name.
	Scope string
	// Consumer is this runner's consumer name in the group. Two runners
	// running at once must not share one. Defaults to "<host>-<pid>-<random>".
	Consumer string
	// StartID is the id a missing group is created at (with MKSTREAM): "0"
	// for every entry of the stream, "$" for the entries added from now on.
	// A group that disappears while the runner runs (Redis restarted
	// without persistence, or the stream deleted) is created again at "0",
	// whatever StartID says. Defaults to "0".
	StartID string
	// Key extracts an entry's dedup key. Defaults to DefaultKey (the "id"
	// field).
	Key func(msg *Message) (string, error)
	// Fingerprint optionally hashes the payload; a redelivery under the same
	// key with another fingerprint is refused as a conflict. Defaults to
	// none.
	Fingerprint func(msg *Message) []byte
	// IsoLevel is the transaction's isolation level. Defaults to the
	// database default (read committed).
	IsoLevel pgx.TxIsoLevel
	// LockTimeout bounds how long a worker waits for a concurrent
	// transaction holding the same key before it tries again after
	// InFlightDelay. Defaults to 0 (wait).
	LockTimeout time.Duration
	// MaxAttempts is how many failed attempts of its handler an entry gets
	// before it is poison. Defaults to the inbox's Config.MaxAttempts;
	// negative means no limit.
	MaxAttempts int
	// MaxDeliveries is how often the group may deliver an entry (Redis's
	// delivery counter) before the runner gives up on it without running its
	// handler again: it is recorded failed, dead-lettered and acknowledged
	// (ErrTooManyDeliveries). Deliveries grow only when an entry is
	// reclaimed from a consumer that died, stopped or lost Redis while it
	// held it (the runner retries a failed handler itself, without a new
	// delivery), so this catches an entry that kills its consumer. Defaults
	// to 20; negative means no limit.
	MaxDeliveries int
	// Workers is the number of entries handled concurrently. Defaults to 4.
	Workers int
	// MaxPending bounds the entries read ahead of the workers, so at most
	// Workers+MaxPending entries are held by this runner (kept alive by the
	// heartbeat). A new XREADGROUP is sent when half of it is free, so a
	// larger buffer costs fewer reads per entry; what it costs is fairness
	// (a slow runner holds its buffer while others idle), and on shutdown
	// the buffered entries are handled within DrainTimeout too. Defaults to
	// max(2×Workers, 64).
	MaxPending int
	// ClaimIdle is how long an entry stays pending, unacknowledged and not
	// kept alive by its consumer, before another consumer reclaims it
	// (XAUTOCLAIM). A runner keeps the entries it holds alive (see
	// Heartbeat), so only those of a consumer that died or lost Redis go
	// idle. Defaults to 30s.
	ClaimIdle time.Duration
	// ClaimInterval is how often the runner looks for idle pending entries
	// to reclaim. Defaults to ClaimIdle/2.
	ClaimInterval time.Duration
	// Heartbeat is how often the runner resets the idle time of the entries
	// it holds (XCLAIM … JUSTID to itself, which does not count a delivery),
	// so that a slow handler, a retry's backoff or a database outage does not
	// let another consumer reclaim them. It must be shorter than ClaimIdle.
	// Defaults to ClaimIdle/3.
	Heartbeat time.Duration
	// Block is how long one XREADGROUP waits for new entries. Run waits for
	// the open one to return when it stops. Defaults to 1s.
	Block time.Duration
	// Backoff gives the delay before the attempt-th failed attempt is tried
	// again, and between tries when the database fails. Defaults to
	// dedupe.Backoff{Min: 100ms, Max: 30s, Jitter: 0.2}.Delay.
	Backoff func(attempt int) time.Duration
	// InFlightDelay is the delay before an entry whose key a concurrent
	// attempt holds is tried again. Defaults to 1s.
	InFlightDelay time.Duration
	// AckTimeout bounds an XACK, a dead-letter copy and one try to record an
	// entry failed. Defaults to 5s.
	AckTimeout time.Duration
	// DeadLetterStream, when set, receives a copy of each entry the runner
	// gives up on (poison, refused, trimmed, delivered too often), added
	// together with the entry's XACK in one MULTI/EXEC, after the entry was
	// recorded failed in the inbox. The copy carries the entry's fields and
	// the Dedupe-* fields (see DeadLetterReasonField). In Redis Cluster it
	// must hash to the stream's slot (a {hash tag}). Defaults to "" (none:
	// the inbox's failed record and the log keep the entry visible).
	DeadLetterStream string
	// DrainTimeout is how long in-flight handlers may run on after Run's
	// context is cancelled before their transactions are cancelled and
	// rolled back (their entries stay pending, for another consumer to
	// reclaim after ClaimIdle). Defaults to 10s.
	DrainTimeout time.Duration
	// Logger receives the runner's logs. Defaults to the inbox's logger.
	// For metrics and traces, set the inbox's Observer: it is told of every
	// handling and of what the runner did beyond it (dedupe.TransportEvent).
	Logger *slog.Logger
}

// withDefaults fills the zero fields of a copy of c for the group and
// validates it.
func (c Config) withDefaults(inbox *dedupe.Inbox, group string) (Config, error) {
	out := c
	if out.Scope == "" {
		out.Scope = group
	}
	if out.Consumer == "" {
		host, _ := os.Hostname()
		out.Consumer = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomSuffix())
	}
	if out.StartID == "" {
		out.StartID = DefaultStartID
	}
	if out.Key == nil {
		out.Key = DefaultKey
	}
	if out.MaxDeliveries == 0 {
		out.MaxDeliveries = DefaultMaxDeliveries
	}
	if out.Workers == 0 {
		out.Workers = DefaultWorkers
	}
	if out.MaxPending == 0 {
		out.MaxPending = max(2*out.Workers, DefaultMinPending)
	}
	if out.ClaimIdle == 0 {
		out.ClaimIdle = DefaultClaimIdle
	}
	if out.ClaimInterval == 0 {
		out.ClaimInterval = out.ClaimIdle / 2
	}
	if out.Heartbeat == 0 {
		out.Heartbeat = out.ClaimIdle / 3
	}
	if out.Block == 0 {
		out.Block = DefaultBlock
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
	if out.Logger == nil {
		out.Logger = inbox.Config().Logger
	}
	bad := func(field, reason string) (Config, error) {
		return out, &dedupe.ConfigError{Field: field, Reason: reason}
	}
	switch {
	case out.Scope == "":
		return bad("Scope", "is required when the group has no name")
	case out.Workers < 0:
		return bad("Workers", "must be positive")
	case out.MaxPending < 0:
		return bad("MaxPending", "must be positive")
	case out.ClaimIdle < time.Millisecond:
		return bad("ClaimIdle", "must be at least 1ms")
	case out.ClaimInterval <= 0:
		return bad("ClaimInterval", "must be positive")
	case out.Heartbeat <= 0 || out.Heartbeat >= out.ClaimIdle:
		return bad("Heartbeat", "must be positive and shorter than ClaimIdle ("+out.ClaimIdle.String()+")")
	case out.Block < time.Millisecond:
		return bad("Block", "must be at least 1ms")
	case out.InFlightDelay < 0:
		return bad("InFlightDelay", "must be positive")
	case out.AckTimeout < 0:
		return bad("AckTimeout", "must be positive")
	case out.DrainTimeout < 0:
		return bad("DrainTimeout", "must be positive")
	case out.LockTimeout < 0:
		return bad("LockTimeout", "must not be negative")
	}
	return out, nil
}
