package dedupekafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// step is how handling a message (or batch) ended.
type step int

const (
	stepDone    step = iota // handled, a duplicate, or given up on: the offset may move past it
	stepStopped             // the context ended first: nothing more of this partition
	stepPaused              // its dead-letter write kept failing: the partition pauses
)

// consume handles the messages of one assigned partition, in order, from
// offset start (an absolute offset, or kafka.FirstOffset/LastOffset when the
// group has none) until ctx ends, recording in c the offset after every
// message done. It has its own reader, so it never waits for another
// partition and no other partition waits for it.
func (r *Runner) consume(ctx context.Context, tp topicPartition, start int64, g *genState) {
	if ctx.Err() != nil {
		return
	}
	c := g.c
	vanished := func() { g.rejoin(tp) }
	rd, err := r.openPartition(tp, start, vanished)
	if err != nil {
		r.cfg.Logger.ErrorContext(ctx, "dedupekafka: cannot read partition", "topic", tp.topic, "partition", tp.id, "err", err)
		return
	}
	defer func() { _ = rd.Close() }()
	expect := start // the offset the first message should have, when known
	batch := make([]kafka.Message, 0, r.cfg.BatchSize)
	backoff := r.cfg.RetryBackoff
	for {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			nrd, ferr := r.fetchFailed(ctx, tp, rd, err, &backoff, vanished)
			if ferr != nil {
				return
			}
			rd, expect = nrd, -1
			continue
		}
		backoff = r.cfg.RetryBackoff
		if expect >= 0 && m.Offset > expect {
			r.startGap(ctx, tp, expect, m.Offset)
		}
		expect = -1
		batch = append(batch[:0], m)
		var fetchErr error
		if r.cfg.BatchSize > 1 {
			batch, fetchErr = r.fill(ctx, rd, batch)
		}
		var done int
		var st step
		if len(batch) == 1 {
			if st = r.handleOne(ctx, batch[0]); st == stepDone {
				done = 1
			}
		} else {
			done, st = r.handleBatch(ctx, batch)
		}
		if done > 0 {
			c.record(tp, batch[done-1].Offset+1)
		}
		switch st {
		case stepStopped:
			return
		case stepPaused:
			r.pause(ctx, tp, rd)
			return
		}
		if fetchErr != nil {
			nrd, ferr := r.fetchFailed(ctx, tp, rd, fetchErr, &backoff, vanished)
			if ferr != nil {
				return
			}
			rd, expect = nrd, -1
		}
	}
}

// startGap reports that the first message of tp is at offset got, past the
// offset want the partition was to start at. When the partition no longer
// holds want (retention deleted it before it was consumed), the messages in
// between are lost: that is an error. Otherwise the offsets are compaction
// gaps or transaction markers, and only logged at debug level.
func (r *Runner) startGap(ctx context.Context, tp topicPartition, want, got int64) {
	first, err := r.firstOffset(ctx, tp)
	switch {
	case err != nil:
		r.cfg.Logger.WarnContext(ctx, "dedupekafka: the partition's first message is past its committed offset, and its first offset could not be read to tell whether retention deleted the offsets in between",
			"topic", tp.topic, "partition", tp.id, "committed", want, "first_message", got, "err", err)
	case first > want:
		r.cfg.Logger.ErrorContext(ctx, "dedupekafka: retention deleted messages of the partition before they were consumed: they are lost",
			"topic", tp.topic, "partition", tp.id, "first_lost", want, "last_lost", min(first, got)-1)
	default:
		r.cfg.Logger.DebugContext(ctx, "dedupekafka: offsets skipped at the start of the partition (compaction or transaction markers)",
			"topic", tp.topic, "partition", tp.id, "from", want, "to", got-1)
	}
}

// firstOffset reads the first offset tp still holds from its leader.
func (r *Runner) firstOffset(ctx context.Context, tp topicPartition) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommitTimeout)
	defer cancel()
	d := r.rc.Dialer
	if d == nil {
		d = kafka.DefaultDialer
	}
	var err error
	for _, broker := range r.rc.Brokers {
		var conn *kafka.Conn
		if conn, err = d.DialLeader(ctx, "tcp", broker, tp.topic, tp.id); err != nil {
			continue
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		}
		first, rerr := conn.ReadFirstOffset()
		_ = conn.Close()
		return first, rerr
	}
	return 0, err
}

// openPartition returns a reader of tp positioned at offset; vanished is
// called when kafka-go reports that the broker does not know tp.
func (r *Runner) openPartition(tp topicPartition, offset int64, vanished func()) (*kafka.Reader, error) {
	errLog := kafkaLogger{log: r.cfg.Logger, next: r.rc.ErrorLogger, vanished: vanished}
	rd := kafka.NewReader(partitionReaderConfig(r.rc, tp.topic, tp.id, errLog))
	if err := rd.SetOffset(offset); err != nil {
		_ = rd.Close()
		return nil, err
	}
	return rd, nil
}

// fill adds messages of rd to batch up to BatchSize, waiting at most Linger
// for more. It returns a fetch error other than the linger's end, to be
// handled after the batch.
func (r *Runner) fill(ctx context.Context, rd *kafka.Reader, batch []kafka.Message) ([]kafka.Message, error) {
	lctx, cancel := context.WithTimeout(ctx, r.cfg.Linger)
	defer cancel()
	for len(batch) < r.cfg.BatchSize {
		m, err := rd.FetchMessage(lctx)
		if err != nil {
			if lctx.Err() != nil {
				return batch, nil
			}
			return batch, err
		}
		batch = append(batch, m)
	}
	return batch, nil
}

// fetchFailed handles a fetch error of tp's reader and returns the reader to
// go on with; an error means ctx ended. An offset out of range (the
// committed offset lies beyond the end of the partition: the topic was
// recreated or truncated) restarts the partition at its first offset; other
// errors are retried with backoff.
func (r *Runner) fetchFailed(ctx context.Context, tp topicPartition, rd *kafka.Reader, err error, backoff *time.Duration, vanished func()) (*kafka.Reader, error) {
	if errOffsetOutOfRange(err) {
		r.cfg.Logger.ErrorContext(ctx, "dedupekafka: the offset to read is beyond the end of the partition (the topic was recreated or truncated): resuming at its first offset; redeliveries are absorbed by the inbox",
			"topic", tp.topic, "partition", tp.id, "err", err)
		_ = rd.Close()
		nrd, oerr := r.openPartition(tp, kafka.FirstOffset, vanished)
		if oerr != nil {
			return nil, fmt.Errorf("reopen %s/%d: %w", tp.topic, tp.id, oerr)
		}
		return nrd, nil
	}
	if errors.Is(err, kafka.UnknownTopicOrPartition) {
		vanished()
	}
	r.cfg.Logger.WarnContext(ctx, "dedupekafka: fetch failed", "topic", tp.topic, "partition", tp.id, "err", err)
	if !sleep(ctx, *backoff) {
		return rd, ctx.Err()
	}
	*backoff = r.cfg.retryBackoff().Next(*backoff)
	return rd, nil
}

// pause stops reading tp until ctx ends (the partition is revoked or the
// runner stops); the partition's next owner resumes at its committed offset.
func (r *Runner) pause(ctx context.Context, tp topicPartition, rd *kafka.Reader) {
	_ = rd.Close()
	r.cfg.Logger.ErrorContext(ctx, "dedupekafka: partition paused until it is reassigned (rebalance or restart); the other partitions go on",
		"topic", tp.topic, "partition", tp.id, "err", ErrPartitionPaused)
	<-ctx.Done()
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
