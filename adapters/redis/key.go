package deduperedis

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/exactlyonce/dedupe"
)

// DefaultKeyField is the field DefaultKey reads, and the field
// OutboxPublisher writes the outbox message's id to.
const DefaultKeyField = "id"

// errMissingField is the cause of a KeyError from FieldKey.
var errMissingField = errors.New("field missing or empty")

// DefaultKey is the default Config.Key: the entry's "id" field
// (DefaultKeyField), the business key a producer puts in every entry of the
// same operation, and the outbox id OutboxPublisher writes. An entry without
// it has no key and is refused (recorded failed under RefusedKey,
// dead-lettered, then acknowledged); the entry id is never used as a silent
// fallback, since a producer that retries XADD makes a new one (see
// EntryKey to opt in).
func DefaultKey(msg *Message) (string, error) { return FieldKey(DefaultKeyField)(msg) }

// FieldKey returns a key function reading the field name, for a business
// key (an order id) that stays the same when a producer adds the same
// operation twice.
func FieldKey(name string) func(*Message) (string, error) {
	return func(msg *Message) (string, error) {
		if v := msg.Field(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: %s", errMissingField, name)
	}
}

// EntryKey is a key function returning "<stream>/<entry id>", which every
// redelivery of an entry carries. Use it only when producers never retry an
// XADD (a retried XADD adds a second entry with another id, which this key
// cannot recognise as a duplicate), and never across a stream that is
// deleted and created again (ids can restart).
func EntryKey(msg *Message) (string, error) { return msg.Stream + "/" + msg.ID, nil }

// RefusedKeyPrefix starts every RefusedKey.
const RefusedKeyPrefix = "deduperedis-refused/"

// RefusedKey returns the inbox key under which the runner records an entry
// it refuses failed: one without a usable key, whose key was used with
// another payload, or whose body was trimmed from the stream while it was
// pending: "deduperedis-refused/<stream>/<entry id>". Operators find refused
// entries by the prefix (dedupe inspect). A stream name too long for the key
// is replaced by a hash of it.
func RefusedKey(stream, id string) string {
	if len(RefusedKeyPrefix)+len(stream)+1+len(id) > dedupe.MaxKeyLen {
		sum := sha256.Sum256([]byte(stream))
		stream = "sha256-" + hex.EncodeToString(sum[:12])
	}
	return RefusedKeyPrefix + stream + "/" + id
}
