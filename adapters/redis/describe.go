package deduperedis

import "github.com/exactlyonce/dedupe"

// describe returns what the inbox's Observer is told of an entry read by
// the consumer group group: its stream, id, delivery count and fields
// (which carry the trace context the outbox publisher wrote).
func describe(group string) func(*Message) dedupe.MessageInfo {
	return func(m *Message) dedupe.MessageInfo {
		info := dedupe.MessageInfo{System: "redis", Destination: m.Stream, ID: m.ID, Group: group,
			Partition: -1, Offset: -1, Delivery: int(m.Deliveries)}
		if m.Values != nil {
			info.Headers = Fields(m.Values)
		}
		return info
	}
}
