package outbox

import (
	"context"
	"fmt"

	"github.com/exactlyonce/dedupe"
)

// Publisher sends outbox messages to a broker. The JetStream and Kafka
// publishers live in adapters/nats and adapters/kafka.
type Publisher interface {
	// Publish sends msgs and returns once the broker confirmed or refused
	// each one. It returns nil when all were confirmed, or one error per
	// message (nil for a confirmed one). msgs hold at most one message per
	// (Topic, Key), so they may be sent concurrently. Wrap an error with
	// Permanent when retrying that message cannot help: it is parked at once.
	Publish(ctx context.Context, msgs []*StoredMessage) []error
}

// PublishFunc is a Publisher that sends one message at a time.
type PublishFunc func(ctx context.Context, msg *StoredMessage) error

// Publish calls f for each message in turn.
func (f PublishFunc) Publish(ctx context.Context, msgs []*StoredMessage) []error {
	var errs []error
	for i, m := range msgs {
		if err := f(ctx, m); err != nil {
			if errs == nil {
				errs = make([]error, len(msgs))
			}
			errs[i] = err
		}
	}
	return errs
}

// orderKey is the unit of ordering: messages of one (topic, key) go out in
// id order, one at a time.
type orderKey struct{ topic, key string }

// failure is one failed publish.
type failure struct {
	msg *StoredMessage
	err error
}

// publish sends the batch in waves: each wave holds the next message of every
// key (and, in the first, all unkeyed ones), so a key never has two messages
// in flight; a key whose message fails sends nothing more this cycle.
func (r *Relay) publish(ctx context.Context, batch []*StoredMessage) (confirmed []*StoredMessage, failures []failure) {
	queues := map[orderKey][]*StoredMessage{}
	var order []orderKey
	var wave []*StoredMessage
	for _, m := range batch {
		if m.Key == "" {
			wave = append(wave, m)
			continue
		}
		k := orderKey{m.Topic, m.Key}
		if _, ok := queues[k]; !ok {
			order = append(order, k)
		}
		queues[k] = append(queues[k], m)
	}
	for {
		for _, k := range order {
			if q := queues[k]; len(q) > 0 {
				wave = append(wave, q[0])
				queues[k] = q[1:]
			}
		}
		if len(wave) == 0 {
			return confirmed, failures
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		errs := r.safePublish(pctx, wave)
		cancel()
		for i, m := range wave {
			if errs[i] == nil {
				confirmed = append(confirmed, m)
				continue
			}
			failures = append(failures, failure{m, errs[i]})
			delete(queues, orderKey{m.Topic, m.Key})
		}
		if ctx.Err() != nil {
			return confirmed, failures
		}
		wave = wave[:0:0]
	}
}

// safePublish calls the publisher, turning a panic or a malformed answer into
// errors for every message.
func (r *Relay) safePublish(ctx context.Context, wave []*StoredMessage) (errs []error) {
	defer func() {
		if v := recover(); v != nil {
			err := &dedupe.PanicError{Value: v}
			errs = make([]error, len(wave))
			for i := range errs {
				errs[i] = err
			}
		}
	}()
	errs = r.pub.Publish(ctx, wave)
	switch {
	case errs == nil:
		return make([]error, len(wave))
	case len(errs) != len(wave):
		err := fmt.Errorf("dedupe: publisher returned %d results for %d messages", len(errs), len(wave))
		errs = make([]error, len(wave))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}
