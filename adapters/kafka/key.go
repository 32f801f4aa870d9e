package dedupekafka

import (
	"strconv"
	"strings"

	"github.com/segmentio/kafka-go"
)

// KeyFromHeaders returns the value of the first of names present on msg
// with a non-empty value (names match case-insensitively), else
// OffsetKey(msg).
func KeyFromHeaders(msg kafka.Message, names ...string) string {
	for _, name := range names {
		for _, h := range msg.Headers {
			if len(h.Value) > 0 && strings.EqualFold(h.Key, name) {
				return string(h.Value)
			}
		}
	}
	return OffsetKey(msg)
}

// OffsetKey returns "topic/partition/offset", the identity the broker gives
// a message: every redelivery of that record carries it, but a producer that
// sends the same event twice makes two offsets.
func OffsetKey(msg kafka.Message) string {
	return msg.Topic + "/" + strconv.Itoa(msg.Partition) + "/" + strconv.FormatInt(msg.Offset, 10)
}
