package deduperedis

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/exactlyonce/dedupe"
)

// Message is one stream entry as the Runner hands it to a handler.
type Message struct {
	// Stream is the stream the entry was read from.
	Stream string
	// ID is the entry's id in the stream ("1700000000000-0"), given by
	// Redis when it was added. A producer that retries XADD adds a new entry
	// with a new id, so the id is not a dedup key unless the producer never
	// retries (see EntryKey).
	ID string
	// Values are the entry's fields.
	Values map[string]any
	// Deliveries is how often the consumer group has delivered the entry,
	// from 1: Redis's delivery counter, which grows when an entry is
	// reclaimed from a consumer that died or stalled (XAUTOCLAIM).
	Deliveries int64

	gone bool // reclaimed, but its body was deleted from the stream
}

// Field returns the value of the entry's field name as a string, "" when it
// has none.
func (m *Message) Field(name string) string { return fieldString(m.Values[name]) }

// fieldString renders a field's value as go-redis returns it (a string) or
// as a caller built it.
func fieldString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case []byte:
		return string(x)
	case int64:
		return strconv.FormatInt(x, 10)
	default:
		return fmt.Sprint(x)
	}
}

// Fields adapts an entry's fields to dedupe.Headers (the interface of
// OpenTelemetry's propagation.TextMapCarrier), so that a trace context
// (traceparent, tracestate) written as fields by OutboxPublisher can be read
// from an entry. Set changes the map.
type Fields map[string]any

var _ dedupe.Headers = Fields(nil)

// Get returns the value of field key, "" when the entry has none.
func (f Fields) Get(key string) string { return fieldString(f[key]) }

// Set sets field key to value.
func (f Fields) Set(key, value string) { f[key] = value }

// Keys lists the field names, sorted.
func (f Fields) Keys() []string {
	out := make([]string, 0, len(f))
	for k := range f {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
