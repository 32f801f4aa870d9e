package dedupekafka

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// KeyFromHeaders returns the value of the first of names present on msg
// with a non-empty value (names match case-insensitively), or "" when none
// is.
func KeyFromHeaders(msg kafka.Message, names ...string) string {
	for _, name := range names {
		for _, h := range msg.Headers {
			if len(h.Value) > 0 && strings.EqualFold(h.Key, name) {
				return string(h.Value)
			}
		}
	}
	return ""
}

// OffsetKey returns "topic/partition/offset", the identity the broker gives
// a message: every redelivery of that record carries it, but a producer that
// sends the same event twice makes two offsets, and a topic deleted and
// recreated reuses the offsets of the old one (see Config.OffsetKeyFallback).
func OffsetKey(msg kafka.Message) string {
	return msg.Topic + "/" + strconv.Itoa(msg.Partition) + "/" + strconv.FormatInt(msg.Offset, 10)
}

// RefusedKeyPrefix starts every RefusedKey.
const RefusedKeyPrefix = "dedupekafka-refused/"

// RefusedKey returns the inbox key under which the runner records a refused
// message failed (one without a usable key, or whose key was used with
// another payload): "dedupekafka-refused/topic/partition/offset/timestamp",
// the timestamp in Unix milliseconds. Operators find refused messages by the
// prefix, and the message itself at that topic, partition and offset. The
// timestamp keeps the key of a message of a recreated topic (whose offsets
// restart) apart from that of the old message at the same offset. A topic
// name too long for the key is replaced by a hash of it.
func RefusedKey(msg kafka.Message) string {
	var ts int64
	if !msg.Time.IsZero() {
		ts = msg.Time.UnixMilli()
	}
	tail := "/" + strconv.Itoa(msg.Partition) + "/" + strconv.FormatInt(msg.Offset, 10) + "/" + strconv.FormatInt(ts, 10)
	topic := msg.Topic
	if len(RefusedKeyPrefix)+len(topic)+len(tail) > dedupe.MaxKeyLen {
		sum := sha256.Sum256([]byte(topic))
		topic = "sha256-" + hex.EncodeToString(sum[:12])
	}
	return RefusedKeyPrefix + topic + tail
}
