package dedupewatermill

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// errMissing is the cause of a KeyError from UUIDKey and MetadataKey.
var errMissing = errors.New("missing or empty")

// UUIDKey is the default Config.Key: the message's UUID, which every
// redelivery of a message carries. A publisher that retries a publish must
// keep the UUID (RelayPublisher sends the outbox id as the UUID).
func UUIDKey(msg *message.Message) (string, error) {
	if msg.UUID == "" {
		return "", fmt.Errorf("uuid %w", errMissing)
	}
	return msg.UUID, nil
}

// MetadataKey returns a key function reading the metadata entry name, for a
// business key (an order id) that stays the same when a publisher sends the
// same operation twice under different UUIDs.
func MetadataKey(name string) func(*message.Message) (string, error) {
	return func(msg *message.Message) (string, error) {
		if v := msg.Metadata.Get(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("metadata %s %w", name, errMissing)
	}
}

// RefusedKeyPrefix starts every RefusedKey.
const RefusedKeyPrefix = "dedupewatermill-refused/"

// RefusedKey returns the inbox key under which a refused message (no usable
// key, or its key reused with another payload) is recorded failed:
// "dedupewatermill-refused/<uuid>", or the prefix and "no-uuid" for a
// message without one.
func RefusedKey(msg *message.Message) string {
	id := msg.UUID
	if id == "" {
		id = "no-uuid"
	}
	if len(id) > 200 {
		id = id[:200]
	}
	return RefusedKeyPrefix + id
}
