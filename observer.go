package dedupe

import (
	"context"
	"time"
)

// Observer is told what the inbox and the transport adapters do, for
// metrics, traces and logs (the outbox has its own, outbox.Observer). Every method takes the context of the
// operation, so an implementation can join the caller's trace. Methods are
// called on the hot path: keep them fast and never block. Embed NopObserver
// to implement only some of them. A nil Observer (the default) costs nothing.
//
// The dedupeotel module implements it with OpenTelemetry spans and metrics.
type Observer interface {
	// StartHandle is called when a message's handling starts (Consumer,
	// BatchConsumer: once per message; leased mode: at Begin). The context
	// it returns is the one the claim and the handler run with (so a span
	// started here is the parent of the handler's own spans); done is called
	// once, when the handling ended, with what it came to.
	StartHandle(ctx context.Context, h HandleInfo) (_ context.Context, done func(HandleDone))
	// LeaseRenewed reports a renewal of a leased claim by KeepAlive; err is
	// nil for a renewal that succeeded.
	LeaseRenewed(ctx context.Context, key Key, err error)
	// LeaseLost reports a leased claim that KeepAlive gave up on.
	LeaseLost(ctx context.Context, key Key, err error)
	// Purged reports a purge (Inbox.Purge): the keys deleted, or its error.
	Purged(ctx context.Context, deleted int64, err error)
	// TransportEvent reports what a transport adapter did with a message
	// beyond its handling: an acknowledgement that failed, a retry, a
	// message refused, dead-lettered or terminated, offsets committed, a
	// partition paused (see the Event constants).
	TransportEvent(ctx context.Context, e TransportEvent)
}

// HandleInfo describes a message whose handling starts.
type HandleInfo struct {
	Key Key
	// Mode is "transactional" (Consumer), "batch" (BatchConsumer) or
	// "leased" (Begin).
	Mode string
	// Message is what the transport adapter knows of the message (see
	// WithMessageInfo); its zero value outside an adapter.
	Message MessageInfo
}

// HandleDone is what a message's handling came to.
type HandleDone struct {
	Outcome Outcome
	// Attempt is the attempt number (0 when no claim was made).
	Attempt int
	// Err is the error Handle returned (nil for claimed and duplicate).
	Err error
	// Duration is the time from StartHandle to the end, commit included.
	Duration time.Duration
}

// MessageInfo is what a transport adapter knows of a message, reported with
// its handling. Its fields follow OpenTelemetry's messaging conventions.
type MessageInfo struct {
	// System is the transport: "nats", "kafka", "webhook", "http".
	System string
	// Destination is the subject, topic or endpoint.
	Destination string
	// ID is the message's id at the transport (Nats-Msg-Id, the delivery
	// id), which may differ from its dedup key.
	ID string
	// Group is the consumer group, durable consumer or endpoint name.
	Group string
	// Partition and Offset locate a Kafka message (-1 elsewhere).
	Partition int
	Offset    int64
	// Delivery is the broker's delivery count, from 1 (0 when unknown).
	Delivery int
	// Headers are the message's headers, for the trace context; nil when the
	// transport has none. They are the message's own (an HTTP request's
	// include its credentials): an Observer reads the propagation keys it
	// needs during StartHandle and neither keeps nor changes them.
	Headers Headers
	// Untrusted marks a message received by a public endpoint (a webhook
	// receiver, an HTTP API), whose headers whoever sent it chose: a
	// signature, if any, covers none of them. An Observer then starts the
	// handling in a trace of its own, records the sender's trace context
	// only as a link, and adopts none of its baggage, so that the sender
	// decides neither which trace the handling joins, nor whether it is
	// sampled, nor what baggage the handler's context (and every outbox
	// message it enqueues) carries. The public transports set it unless
	// configured to trust their callers (webhook.Config.TrustCallers,
	// httpidem.Config.TrustCallers); broker consumers leave it false, for
	// the producers are yours.
	Untrusted bool
}

// Headers are a message's headers as a trace propagator reads and writes
// them: the interface of OpenTelemetry's propagation.TextMapCarrier, so no
// tracing library is needed to implement it.
type Headers interface {
	Get(key string) string
	Set(key, value string)
	Keys() []string
}

// MapHeaders adapts map[string][]string (http.Header, nats.Header, the
// outbox.Message.Headers) to Headers. Keys are used as given.
type MapHeaders map[string][]string

// Get returns the first value of key.
func (h MapHeaders) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set sets key to the single value.
func (h MapHeaders) Set(key, value string) { h[key] = []string{value} }

// Keys lists the keys.
func (h MapHeaders) Keys() []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	return out
}

// TransportEvent is something a transport adapter did with a message (or a
// partition) beyond its handling, which StartHandle reports. Its Name is
// one of the Event constants.
type TransportEvent struct {
	// Name says what happened: EventAckFailed, EventRetried, EventReleased,
	// EventRefused, EventDeadLettered, EventDeadLetterFailed,
	// EventTerminated, EventBatchHandled, EventBatchFallback,
	// EventOffsetsCommitted, EventOffsetCommitFailed or
	// EventPartitionPaused.
	Name string
	// Key is the inbox key the event concerns: the message's dedup key, or
	// the key a refused message was recorded under (the Kafka adapter's
	// RefusedKey); zero when there is none.
	Key Key
	// Message is what the adapter knows of the message; for an event of a
	// partition or a consumer group, only System, Destination, Group and
	// Partition (-1 for several) are set.
	Message MessageInfo
	// Err is why, for the events that have a cause (see each name).
	Err error
	// Delay is how long the adapter waits before it tries the message again
	// (EventRetried); 0 otherwise.
	Delay time.Duration
	// Count is how many messages or partitions the event covers: 1 unless
	// the name says otherwise (EventBatchHandled, EventBatchFallback,
	// EventOffsetsCommitted).
	Count int
}

// Names of TransportEvent. An adapter ends every message it takes in one of
// three ways: a handling that settled it (StartHandle's done reports
// OutcomeClaimed or OutcomeDuplicate, and the broker is acknowledged or the
// offset moves past it), EventTerminated (given up for good, with a visible
// record), or a hand-back to the broker (EventRetried, EventReleased, or
// EventAckFailed, whose redelivery the inbox absorbs). The other events say
// what happened on the way. The handling's own outcomes are not repeated as
// events.
const (
	// EventAckFailed: the message's effects committed (or it was a
	// duplicate), but its acknowledgement failed (NATS: a DoubleAck that the
	// server did not confirm within Config.AckTimeout, or an AckSingle that
	// could not be sent). The broker delivers
	// it again and the inbox absorbs the copy as a duplicate, so the effect
	// still happens once. Err is the acknowledgement's error.
	EventAckFailed = "ack_failed"
	// EventRetried: the message was not settled and the adapter will try it
	// again after Delay. Why is in Err: its handler failed (the attempt is
	// counted by the inbox, not by this event), a concurrent attempt held
	// its key (ErrInFlight), the database failed, or its dead-letter copy
	// could not be written. The NATS adapter naks it with Delay (Backoff,
	// or InFlightDelay), or, when the database failed, holds it (marked in
	// progress, so no delivery is spent) and tries again after Delay. The
	// Kafka adapter's partition waits Delay and tries the same message
	// again; a message whose attempt failed inside a batch is retried at
	// once on its own (Delay 0). One event per try scheduled.
	EventRetried = "retried"
	// EventReleased: the runner was stopping and handed the message back to
	// the broker for immediate redelivery (NATS: Nak without delay), either
	// unhandled (it was buffered; Err nil) or after its transaction was
	// rolled back (Err: the handling's error, such as the cancelled
	// context). No attempt was counted; whatever it wrote was rolled back,
	// unless its COMMIT raced the cancellation, in which case the
	// redelivery is absorbed as a duplicate.
	EventReleased = "released"
	// EventRefused: the message can never be processed as it is, so its
	// handler does not run: it has no usable key (Err matches ErrNoKey or
	// ErrInvalidKey, or the adapter's own no-key error), or its key was used
	// before with another payload (Err matches ErrConflict). The adapter
	// gives up on it (EventTerminated), keeping it visible where it can: the
	// Kafka adapter records it failed under its RefusedKey, and with a
	// dead-letter destination a copy is written there; the NATS adapter
	// without DeadLetterSubject only logs it (at error level) as it
	// terminates it. The webhook adapter reports a
	// delivery it refuses before any claim (not a POST, a body too large or
	// unreadable, a missing or wrong signature, a stale timestamp, no event
	// id) with the typed error: no key is touched, nothing is recorded, and
	// the provider may send it again.
	EventRefused = "refused"
	// EventDeadLettered: a copy of the message was written to the adapter's
	// dead-letter destination and acknowledged there (NATS:
	// Config.DeadLetterSubject; Kafka: Config.DeadLetter). The adapter then
	// gives up on the message (EventTerminated). Err is why it was given up.
	EventDeadLettered = "dead_lettered"
	// EventDeadLetterFailed: writing the dead-letter copy failed (Err). It
	// is tried again: the Kafka adapter up to Config.DeadLetterAttempts,
	// then the partition pauses (EventPartitionPaused); the NATS adapter
	// naks the message (EventRetried), or at its last delivery holds it and
	// keeps trying.
	EventDeadLetterFailed = "dead_letter_failed"
	// EventTerminated: the adapter gave up on the message for good: its key
	// recorded failed in the inbox (poisoned), a copy dead-lettered, or (a
	// refused message without a dead-letter destination) only this event
	// and the adapter's error log. The NATS adapter
	// terminates it (Term), so JetStream never delivers it again; the Kafka
	// adapter lets the partition's offset move past it. Err is why
	// (matching ErrPoisoned, ErrConflict, ErrNoKey ...; the NATS adapter
	// joins its ErrDeadLettered when a copy was written).
	EventTerminated = "terminated"
	// EventBatchHandled: the Kafka adapter handed a batch of Count messages
	// of one partition (the NATS adapter in batch mode, Count fetched
	// messages) to a BatchConsumer, whose transaction claims them together.
	// Message is the batch's first message.
	EventBatchHandled = "batch_handled"
	// EventBatchFallback: a batch did not settle every message (a handler
	// failed, a key was in flight, the database failed), so the Kafka
	// adapter handles its unsettled messages, from Message on, one
	// transaction each, in order (the NATS adapter: those of them in
	// flight or hit by a database error). Once per batch; Count is how many
	// messages it handles one by one.
	EventBatchFallback = "batch_fallback"
	// EventOffsetsCommitted: the Kafka adapter committed the consumer
	// group's offsets of Count partitions, in one request, each past
	// messages whose effects had committed.
	EventOffsetsCommitted = "offsets_committed"
	// EventOffsetCommitFailed: an offset commit failed (Err). The offsets
	// are sent again at the next interval; should the member stop first,
	// the messages since the last commit are delivered again and absorbed
	// as duplicates.
	EventOffsetCommitFailed = "offset_commit_failed"
	// EventPartitionPaused: the Kafka adapter stopped reading a partition
	// because the dead-letter copy of Message could not be written after
	// every try (Err). The partition's offset stays before that message,
	// the other partitions go on, and it stays paused until it is
	// reassigned (a rebalance or a restart).
	EventPartitionPaused = "partition_paused"
)

type messageInfoKey struct{}

// WithMessageInfo returns ctx carrying m, for the Observer: a transport
// adapter without a ConsumerConfig.Describe calls it before handing a
// message to a Consumer.
func WithMessageInfo(ctx context.Context, m MessageInfo) context.Context {
	return withMessageInfo(ctx, &m)
}

// withMessageInfo returns ctx carrying *m, which must not change after.
func withMessageInfo(ctx context.Context, m *MessageInfo) context.Context {
	return context.WithValue(ctx, messageInfoKey{}, m)
}

// MessageInfoFrom returns the MessageInfo in ctx, or its zero value. A
// handler finds its message's there when the inbox has an Observer and the
// consumer a Describe (every transport adapter sets one), or when the
// caller put it there with WithMessageInfo.
func MessageInfoFrom(ctx context.Context) MessageInfo {
	if m, _ := ctx.Value(messageInfoKey{}).(*MessageInfo); m != nil {
		return *m
	}
	return MessageInfo{}
}

// NopObserver does nothing; embed it to implement part of Observer.
type NopObserver struct{}

var _ Observer = NopObserver{}

// StartHandle returns ctx and a done that does nothing.
func (NopObserver) StartHandle(ctx context.Context, _ HandleInfo) (context.Context, func(HandleDone)) {
	return ctx, func(HandleDone) {}
}

// LeaseRenewed does nothing.
func (NopObserver) LeaseRenewed(context.Context, Key, error) {}

// LeaseLost does nothing.
func (NopObserver) LeaseLost(context.Context, Key, error) {}

// Purged does nothing.
func (NopObserver) Purged(context.Context, int64, error) {}

// TransportEvent does nothing.
func (NopObserver) TransportEvent(context.Context, TransportEvent) {}

// Observers fans every call out to each of obs, in order; nil entries are
// skipped.
func Observers(obs ...Observer) Observer {
	var out multiObserver
	for _, o := range obs {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

type multiObserver []Observer

func (m multiObserver) StartHandle(ctx context.Context, h HandleInfo) (context.Context, func(HandleDone)) {
	dones := make([]func(HandleDone), len(m))
	for n, o := range m {
		ctx, dones[n] = o.StartHandle(ctx, h)
	}
	return ctx, func(d HandleDone) {
		for n := len(dones) - 1; n >= 0; n-- {
			dones[n](d)
		}
	}
}

func (m multiObserver) LeaseRenewed(ctx context.Context, key Key, err error) {
	for _, o := range m {
		o.LeaseRenewed(ctx, key, err)
	}
}

func (m multiObserver) LeaseLost(ctx context.Context, key Key, err error) {
	for _, o := range m {
		o.LeaseLost(ctx, key, err)
	}
}

func (m multiObserver) Purged(ctx context.Context, n int64, err error) {
	for _, o := range m {
		o.Purged(ctx, n, err)
	}
}

func (m multiObserver) TransportEvent(ctx context.Context, e TransportEvent) {
	for _, o := range m {
		o.TransportEvent(ctx, e)
	}
}

// observe starts observing a handling with i's Observer, if any; m is what
// the transport knows of the message (nil: the context's). The returned done
// is never nil.
func (i *Inbox) observe(ctx context.Context, key Key, mode string, m *MessageInfo) (context.Context, func(Outcome, int, error)) {
	obs := i.cfg.Observer
	if obs == nil {
		return ctx, nopDone
	}
	if m == nil {
		info := MessageInfoFrom(ctx)
		m = &info
	}
	start := time.Now()
	ctx, done := obs.StartHandle(ctx, HandleInfo{Key: key, Mode: mode, Message: *m})
	return ctx, func(o Outcome, attempt int, err error) {
		done(HandleDone{Outcome: o, Attempt: attempt, Err: err, Duration: time.Since(start)})
	}
}

func nopDone(Outcome, int, error) {}
