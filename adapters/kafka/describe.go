package dedupekafka

import (
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// describe returns what the inbox's Observer is told of a message read by
// the consumer group group: its topic, partition, offset and headers (which
// carry the trace context the outbox publisher wrote).
func describe(group string) func(kafka.Message) dedupe.MessageInfo {
	return func(m kafka.Message) dedupe.MessageInfo {
		return dedupe.MessageInfo{
			System: "kafka", Destination: m.Topic, Group: group,
			Partition: m.Partition, Offset: m.Offset,
			Headers: (*Headers)(&m.Headers),
		}
	}
}

// Headers adapts a Kafka message's headers to dedupe.Headers (the
// interface of OpenTelemetry's propagation.TextMapCarrier), so a trace
// context can be read from and written to them. Keys are matched exactly;
// Set replaces every header of the key.
type Headers []kafka.Header

var _ dedupe.Headers = (*Headers)(nil)

// Get returns the value of the first header named key, "" when none is.
func (h *Headers) Get(key string) string {
	for _, x := range *h {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}

// Set replaces the headers named key with one holding value, in a new
// slice: the message's own headers, which h may share, are not changed.
func (h *Headers) Set(key, value string) {
	out := make([]kafka.Header, 0, len(*h)+1)
	for _, x := range *h {
		if x.Key != key {
			out = append(out, x)
		}
	}
	*h = append(out, kafka.Header{Key: key, Value: []byte(value)})
}

// Keys lists the header names, in order, each once.
func (h *Headers) Keys() []string {
	out := make([]string, 0, len(*h))
	for _, x := range *h {
		seen := false
		for _, k := range out {
			if k == x.Key {
				seen = true
				break
			}
		}
		if !seen {
			out = append(out, x.Key)
		}
	}
	return out
}
