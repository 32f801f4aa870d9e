// Package dedupeamqp gives RabbitMQ consumers (github.com/rabbitmq/amqp091-go)
// exactly-once effects.
//
// A Runner consumes a queue with N workers and manual acknowledgements and,
// for each delivery, begins a PostgreSQL transaction, claims the message's
// key in the dedupe inbox, runs the handler with that transaction, commits,
// and only then acknowledges the delivery. A crash between the commit and the
// ack leads to a redelivery, which finds the committed claim and is
// acknowledged as a duplicate without running the handler again.
//
// The key is the message_id property (DefaultKey); set Config.Key to use a
// header (HeaderKey) or any function of the message (a business key). The
// scope is the queue name.
//
// # Outcomes
//
// Every message ends in one visible state: its effect committed once, its key
// failed in the inbox (listed by dedupe inspect and Inbox.Stats), or a copy
// in a dead-letter destination. Outcomes map to broker actions:
//
//	outcome                                   broker action
//	----------------------------------------  ---------------------------------------------
//	processed (OutcomeClaimed), duplicate     basic.ack
//	handler error (an attempt)                held Config.Backoff(attempt), then basic.nack requeue
//	poison: attempts used up, dedupe.Permanent,
//	  or a failure at the last delivery the
//	  queue allows (Config.DeliveryLimit)     key recorded failed, then dead-lettered (below)
//	a concurrent attempt holds the key        held Config.InFlightDelay, then basic.nack requeue
//	database unreachable                      not an attempt: held and retried in place with
//	                                          Config.Backoff, no delivery spent
//	no usable key, key reused with another
//	  payload (dedupe.ErrConflict)            recorded failed under RefusedKey, then dead-lettered
//	shutdown                                  in-flight work gets Config.DrainTimeout to commit;
//	                                          the rest is rolled back and handed back
//	                                          (basic.nack requeue), never acked
//	channel or connection died                nothing: its delivery tags died with it and the
//	                                          broker requeued the messages; work that
//	                                          committed meanwhile is absorbed as a duplicate
//
// Dead-lettering: with Config.DeadLetterExchange set, a copy (original body,
// properties and headers, plus the Dedupe-* headers) is published there with
// publisher confirms and the mandatory flag, and the delivery is acked only
// once the broker confirmed the copy; a copy that fails (nacked, unroutable,
// channel died) is retried later and the delivery held. Without it, the
// delivery is rejected without requeue (basic.reject requeue=false), which
// routes it to the queue's own dead-letter exchange (x-dead-letter-exchange);
// a queue without one drops it, but it is recorded failed in the inbox first.
// Poison and refused messages are recorded in the inbox before they are
// dead-lettered, so the inbox lists them even where the copy is lost.
//
// # Why retries are held by the runner
//
// RabbitMQ has no delayed negative acknowledgement. The two ways to delay a
// retry are a retry exchange whose TTL queue dead-letters back into the work
// queue, and a delivery held unacknowledged by the runner for the delay and
// then requeued. This package holds: it needs no topology beyond the user's
// queue (a TTL queue per delay, or per-message TTLs, which RabbitMQ only
// expires at the head of a queue, so a long delay blocks shorter ones behind
// it), it follows Config.Backoff per attempt exactly, the requeued message
// keeps its place in the queue's dead-lettering and delivery-limit
// accounting, and a runner that dies while holding one loses nothing: the
// broker requeues it at once and the attempt is already counted in the
// inbox. The price: a held delivery occupies a prefetch slot (Config.Prefetch)
// during its delay, and each retry spends one delivery of a quorum queue's
// x-delivery-limit.
//
// # Connections
//
// amqp091-go does not reconnect by itself (its optional Config.Recovery must
// stay off: a recovered channel reuses delivery tags, so an ack meant for a
// delivery of the dead channel could ack another message). The Runner dials
// the broker itself, opens a channel, sets basic.qos to Config.Prefetch,
// consumes with manual acks, and watches the connection's and channel's
// close notifications and the consumer-cancel notification. When either
// closes it dials again with Config.Reconnect (a dedupe.Backoff) and
// consumes again. A delivery tag is only ever acknowledged on the channel it
// came from, and never once that channel died: the broker has requeued those
// messages and their redelivery is absorbed by the inbox. When the broker
// cancels the consumer (the queue was deleted), the Runner checks whether the
// queue exists: if so it consumes again, if not Run returns an error matching
// ErrQueueGone.
//
// # Broker limits
//
// x-delivery-limit. A quorum queue with x-delivery-limit L drops a message
// (or dead-letters it with reason delivery_limit) once it has been returned L
// times; x-delivery-count says how often it was. RabbitMQ 3.10 counts every
// return: nacks of retries and shutdowns, and deliveries of a channel that
// died. Only handler failures are attempts in the inbox, so set
// Config.DeliveryLimit to the queue's L: the Runner then treats a delivery
// with x-delivery-count ≥ L as the last one. It never requeues it: a handler
// failure there is permanent (recorded failed, dead-lettered); one it has to
// give up on (a shutdown, a handler cancelled after DrainTimeout) is recorded
// failed with ErrLastDelivery, or copied to Config.DeadLetterExchange when
// the database cannot record it, before it is rejected; when neither works
// it holds the message and keeps trying, and Run does not return until it
// succeeds. MaxAttempts is capped at L+1, so the inbox's attempt limit
// decides whenever the queue's deliveries were not spent on something else.
// A connection lost with a message at its last delivery makes the broker
// drop it: one the runner already took (in a handler, or waiting for a
// worker) is still handled from its in-memory copy, since nothing will
// deliver it again. What it cannot defend is a process killed with one, or
// one still in the client library's prefetch buffer when the connection
// died: give the queue a dead-letter exchange so the
// broker's own drop is a copy, and an x-delivery-limit well above
// MaxAttempts (or none: classic queues and 3.10's quorum queues have none by
// default), so that the inbox's limit is the one that decides. RabbitMQ 4.0
// gives every quorum queue a delivery limit of 20 unless it sets its own:
// there, set DeliveryLimit to 20 even for a queue declared without one.
//
// consumer_timeout. RabbitMQ closes a channel whose delivery stays
// unacknowledged longer than consumer_timeout (30 minutes by default); keep
// handlers and Config.Backoff far below it. Such a close is handled like any
// other: the runner consumes again, the inbox absorbs the redelivery.
//
// # Observing
//
// The runner has no metrics of its own. The inbox's Observer
// (dedupe.Config.Observer; dedupeotel's for OpenTelemetry) is told of every
// handling, with System "rabbitmq", the queue as Destination, the
// message_id, the delivery count (x-delivery-count + 1, or 2 for a
// redelivery without it) and the headers (which carry the trace context the
// outbox publisher wrote), and of what the runner did beyond it, as
// dedupe.TransportEvent: EventAckFailed, EventRetried, EventReleased,
// EventRefused, EventDeadLettered, EventDeadLetterFailed and
// EventTerminated. Config.Logger logs the same events that need attention.
package dedupeamqp
