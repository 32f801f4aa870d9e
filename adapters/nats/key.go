package dedupenats

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
)

// DefaultKey is the default Config.Key: the Nats-Msg-Id header when present,
// else "<stream>:<stream sequence>", which every redelivery of a stored
// message carries. A publisher that retries a publish should set
// Nats-Msg-Id; otherwise the retry is a new stream message with a new key.
func DefaultKey(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	meta, err := msg.Metadata()
	if err != nil {
		return "", err
	}
	return meta.Stream + ":" + strconv.FormatUint(meta.Sequence.Stream, 10), nil
}

// errMissingHeader is the cause of a KeyError from HeaderKey.
var errMissingHeader = errors.New("header missing or empty")

// HeaderKey returns a key function reading the header name, for a business
// key (an order id) that stays the same when a publisher sends the same
// operation twice under different Nats-Msg-Ids. A message without the header
// has no key and is refused: recorded failed under RefusedKey, copied to
// Config.DeadLetterSubject when set, and terminated.
func HeaderKey(name string) func(jetstream.Msg) (string, error) {
	return func(msg jetstream.Msg) (string, error) {
		if v := msg.Headers().Get(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: %s", errMissingHeader, name)
	}
}

// RefusedKeyPrefix starts every RefusedKey.
const RefusedKeyPrefix = "dedupenats-refused/"

// RefusedKey returns the inbox key under which the runner records a message
// it refuses failed (one without a usable key, or whose key was used with
// another payload), as the Kafka runner does:
// "dedupenats-refused/<stream>/<stream sequence>/<timestamp>", the time the
// stream stored the message in Unix milliseconds. Operators find refused
// messages by the prefix (dedupe inspect, Inbox.Stats counts them failed)
// and the message itself by its stream and sequence; the timestamp keeps a
// message of a recreated stream (whose sequences restart) apart from the
// old one. A stream name too long for the key is replaced by a hash of it.
// A message without JetStream metadata is named by its subject and a hash of
// its headers and data instead.
func RefusedKey(msg jetstream.Msg) string {
	meta, err := msg.Metadata()
	if err != nil {
		h := sha256.New()
		h.Write([]byte(msg.Subject()))
		for name, values := range msg.Headers() {
			for _, v := range values {
				h.Write([]byte{0})
				h.Write([]byte(name + ":" + v))
			}
		}
		h.Write([]byte{0})
		h.Write(msg.Data())
		return RefusedKeyPrefix + "no-metadata/sha256-" + hex.EncodeToString(h.Sum(nil)[:16])
	}
	tail := "/" + strconv.FormatUint(meta.Sequence.Stream, 10) + "/" + strconv.FormatInt(meta.Timestamp.UnixMilli(), 10)
	stream := meta.Stream
	if len(RefusedKeyPrefix)+len(stream)+len(tail) > dedupe.MaxKeyLen {
		sum := sha256.Sum256([]byte(stream))
		stream = "sha256-" + hex.EncodeToString(sum[:12])
	}
	return RefusedKeyPrefix + stream + tail
}
