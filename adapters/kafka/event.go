package dedupekafka

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// event tells the inbox's Observer what the runner did with msg beyond its
// handling (name, one of the dedupe.Event constants), the inbox key it
// concerns (zero: msg's own, when it has a usable one), why (err) and, for
// a retry, after how long. Without an Observer it costs nothing.
func (r *Runner) event(ctx context.Context, name string, msg *kafka.Message, key dedupe.Key, err error, delay time.Duration, count int) {
	if r.obs == nil {
		return
	}
	if key.ID == "" {
		key, _ = r.consumer.KeyOf(*msg)
	}
	r.obs.TransportEvent(ctx, dedupe.TransportEvent{
		Name: name, Key: key, Message: r.describe(*msg), Err: err, Delay: delay, Count: max(count, 1),
	})
}

// batchEvent tells the inbox's Observer what the runner did with a batch
// (name), of count messages from msg on.
func (r *Runner) batchEvent(ctx context.Context, name string, msg *kafka.Message, err error, count int) {
	if r.obs == nil {
		return
	}
	r.obs.TransportEvent(ctx, dedupe.TransportEvent{Name: name, Message: r.describe(*msg), Err: err, Count: max(count, 1)})
}

// groupEvent tells the inbox's Observer what the runner did for the group
// (offsets committed, or not) over count partitions. The event's
// destination is the consumed topic, when there is one.
func (r *Runner) groupEvent(ctx context.Context, name string, err error, count int) {
	if r.obs == nil {
		return
	}
	m := dedupe.MessageInfo{System: "kafka", Group: r.rc.GroupID, Partition: -1, Offset: -1}
	if topics := groupTopics(r.rc); len(topics) == 1 {
		m.Destination = topics[0]
	}
	r.obs.TransportEvent(ctx, dedupe.TransportEvent{Name: name, Message: m, Err: err, Count: max(count, 1)})
}
