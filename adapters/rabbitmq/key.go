package dedupeamqp

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
)

// errNoMessageID is the cause of a KeyError from DefaultKey.
var errNoMessageID = errors.New("message_id property missing")

// errMissingHeader is the cause of a KeyError from HeaderKey.
var errMissingHeader = errors.New("header missing, empty or not a string or number")

// DefaultKey is the default Config.Key: the message_id property, which a
// publisher sets once per message and keeps when it publishes it again (the
// outbox publisher sets the outbox ID). A message without one has no key and
// is refused.
func DefaultKey(d amqp.Delivery) (string, error) {
	if d.MessageId == "" {
		return "", errNoMessageID
	}
	return d.MessageId, nil
}

// HeaderKey returns a key function reading the header name, for a business
// key (an order id) that stays the same when a publisher sends the same
// operation twice under different message_ids. A string, byte slice or
// integer value is used as it is; a message without the header has no key
// and is refused.
func HeaderKey(name string) func(amqp.Delivery) (string, error) {
	return func(d amqp.Delivery) (string, error) {
		if v := headerString(d.Headers, name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: %s", errMissingHeader, name)
	}
}

// headerString returns the header name of t as a string, "" when it is
// missing or of another type.
func headerString(t amqp.Table, name string) string {
	switch v := t[name].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case int:
		return strconv.Itoa(v)
	case int8:
		return strconv.FormatInt(int64(v), 10)
	case int16:
		return strconv.FormatInt(int64(v), 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case int64:
		return strconv.FormatInt(v, 10)
	case uint8:
		return strconv.FormatUint(uint64(v), 10)
	case uint16:
		return strconv.FormatUint(uint64(v), 10)
	case uint32:
		return strconv.FormatUint(uint64(v), 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	}
	return ""
}

// headerInt returns the integer header name of t, and whether it is one.
func headerInt(t amqp.Table, name string) (int64, bool) {
	switch v := t[name].(type) {
	case int:
		return int64(v), true
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	}
	return 0, false
}

// RefusedKeyPrefix starts every RefusedKey.
const RefusedKeyPrefix = "dedupeamqp-refused/"

// RefusedKey returns the inbox key under which the runner records a refused
// message failed (one without a usable key, or whose key was used with
// another payload): "dedupeamqp-refused/<queue>/<hash>", the hash a SHA-256
// of the message_id, the given key and the body. RabbitMQ gives a message no
// identity of its own, so copies of one refused message share a record, and
// operators find refused messages by the prefix. A queue name too long for
// the key is replaced by a hash of it.
func RefusedKey(queue, key string, d amqp.Delivery) string {
	h := sha256.New()
	h.Write([]byte(d.MessageId))
	h.Write([]byte{0})
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(d.Body)
	tail := "/" + hex.EncodeToString(h.Sum(nil)[:16])
	if len(RefusedKeyPrefix)+len(queue)+len(tail) > dedupe.MaxKeyLen {
		sum := sha256.Sum256([]byte(queue))
		queue = "sha256-" + hex.EncodeToString(sum[:12])
	}
	return RefusedKeyPrefix + queue + tail
}
