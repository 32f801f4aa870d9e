package dedupeamqp

import (
	"maps"
	"slices"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
)

// System is the messaging.system of RabbitMQ in the Observer's
// dedupe.MessageInfo (OpenTelemetry's value for RabbitMQ).
const System = "rabbitmq"

// describe returns what the inbox's Observer is told of a delivery from
// queue consumed by group: the queue, message_id, delivery count and headers
// (which carry the trace context the outbox publisher wrote).
func describe(queue, group string) func(amqp.Delivery) dedupe.MessageInfo {
	return func(d amqp.Delivery) dedupe.MessageInfo {
		return dedupe.MessageInfo{
			System: System, Destination: queue, ID: d.MessageId, Group: group,
			Partition: -1, Offset: -1, Delivery: deliveryNumber(d), Headers: TableHeaders(d.Headers),
		}
	}
}

// deliveryNumber is the delivery's number from 1: x-delivery-count + 1 when
// the queue counts (a quorum queue), else 2 for a redelivery and 1 for a
// first delivery.
func deliveryNumber(d amqp.Delivery) int {
	if n, ok := headerInt(d.Headers, deliveryCountHeader); ok {
		return int(n) + 1
	}
	if d.Redelivered {
		return 2
	}
	return 1
}

// deliveryCountHeader is the header in which a quorum queue says how often
// a message was returned to it.
const deliveryCountHeader = "x-delivery-count"

// TableHeaders adapts an AMQP header table to dedupe.Headers (the
// OpenTelemetry TextMapCarrier interface), so that a propagator reads and
// writes trace context in it. Get returns string (and byte slice) values
// only.
type TableHeaders amqp.Table

// Get returns the string value of key, "" when it is missing or not a
// string.
func (h TableHeaders) Get(key string) string {
	switch v := h[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Set sets key to value. Setting on a nil TableHeaders does nothing.
func (h TableHeaders) Set(key, value string) {
	if h != nil {
		h[key] = value
	}
}

// Keys returns the keys, sorted.
func (h TableHeaders) Keys() []string { return slices.Sorted(maps.Keys(h)) }
