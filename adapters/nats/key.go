package dedupenats

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
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
// has no key and is terminated.
func HeaderKey(name string) func(jetstream.Msg) (string, error) {
	return func(msg jetstream.Msg) (string, error) {
		if v := msg.Headers().Get(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: %s", errMissingHeader, name)
	}
}
