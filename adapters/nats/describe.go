package dedupenats

import (
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// describe returns what the inbox's Observer is told of a message of the
// consumer named group: its subject, Nats-Msg-Id, delivery count and
// headers (which carry the trace context the outbox publisher wrote).
func describe(group string) func(jetstream.Msg) dedupe.MessageInfo {
	return func(msg jetstream.Msg) dedupe.MessageInfo {
		m := dedupe.MessageInfo{System: "nats", Destination: msg.Subject(), Group: group, Partition: -1, Offset: -1}
		if h := msg.Headers(); h != nil {
			m.ID = h.Get(jetstream.MsgIDHeader)
			m.Headers = dedupe.MapHeaders(h)
		}
		if meta, err := msg.Metadata(); err == nil {
			m.Delivery = int(meta.NumDelivered)
		}
		return m
	}
}

// consumerName is the JetStream consumer's name, "" when not known.
func consumerName(cons jetstream.Consumer) string {
	if ci := cons.CachedInfo(); ci != nil {
		return ci.Name
	}
	return ""
}
