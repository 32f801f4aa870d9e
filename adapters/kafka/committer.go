package dedupekafka

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// topicPartition names one partition.
type topicPartition struct {
	topic string
	id    int
}

// committer coalesces the offsets of one generation: partition workers
// record the offset after the last message whose effects committed, and
// flush sends the latest of every partition that moved, in one request. It
// never sends an offset no worker recorded, so an offset is never committed
// before its effects.
type committer struct {
	commit func(map[string]map[int]int64) error

	mu      sync.Mutex
	pending map[topicPartition]int64 // recorded, not yet committed
	banned  map[topicPartition]bool  // vanished: never committed again
	flushMu sync.Mutex               // one flush at a time
}

func newCommitter(commit func(map[string]map[int]int64) error) *committer {
	return &committer{commit: commit, pending: map[topicPartition]int64{}, banned: map[topicPartition]bool{}}
}

// record notes that every message of tp before next is done.
func (c *committer) record(tp topicPartition, next int64) {
	c.mu.Lock()
	if cur, ok := c.pending[tp]; !c.banned[tp] && (!ok || next > cur) {
		c.pending[tp] = next
	}
	c.mu.Unlock()
}

// ban forgets tp's uncommitted offset and ignores its later ones: the
// partition vanished (its topic was deleted), and an old offset committed to
// a recreated topic would skip its new messages.
func (c *committer) ban(tp topicPartition) {
	c.mu.Lock()
	delete(c.pending, tp)
	c.banned[tp] = true
	c.mu.Unlock()
}

// flush commits the recorded offsets. On failure they stay pending (unless a
// newer one was recorded meanwhile) for the next flush, except when the
// broker no longer knows a partition: then they are dropped, for the same
// reason as in ban. It reports how many partitions it committed.
func (c *committer) flush() (int, error) {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	c.mu.Lock()
	if len(c.pending) == 0 {
		c.mu.Unlock()
		return 0, nil
	}
	sent := c.pending
	c.pending = map[topicPartition]int64{}
	c.mu.Unlock()

	offsets := map[string]map[int]int64{}
	for tp, off := range sent {
		if offsets[tp.topic] == nil {
			offsets[tp.topic] = map[int]int64{}
		}
		offsets[tp.topic][tp.id] = off
	}
	err := c.commit(offsets)
	if errors.Is(err, kafka.UnknownTopicOrPartition) {
		return 0, err
	}
	if err != nil {
		c.mu.Lock()
		for tp, off := range sent {
			if cur, ok := c.pending[tp]; !c.banned[tp] && (!ok || off > cur) {
				c.pending[tp] = off
			}
		}
		c.mu.Unlock()
		return 0, err
	}
	return len(sent), nil
}

// run flushes every interval until ctx ends.
func (c *committer) run(ctx context.Context, interval time.Duration, onFlush func(int, error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			onFlush(c.flush())
		}
	}
}
