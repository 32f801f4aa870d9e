package dedupekafka

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
)

// kafka-go's defaults for the read backoff, which NewReader panics on when
// the maximum ends up below the minimum.
const (
	kafkaReadBackoffMin = 100 * time.Millisecond
	kafkaReadBackoffMax = time.Second
)

// groupTopics returns the topics a group reader configuration consumes.
func groupTopics(rc kafka.ReaderConfig) []string {
	if len(rc.GroupTopics) > 0 {
		return rc.GroupTopics
	}
	if rc.Topic == "" {
		return nil
	}
	return []string{rc.Topic}
}

// checkReaderConfig refuses, with a *dedupe.ConfigError, a reader
// configuration kafka-go would reject (or panic on) later.
func checkReaderConfig(rc kafka.ReaderConfig) error {
	if rc.GroupID == "" {
		return ErrNoGroup
	}
	if len(groupTopics(rc)) == 0 {
		return &dedupe.ConfigError{Field: "ReaderConfig.Topic", Reason: "set Topic or GroupTopics"}
	}
	if rc.Partition != 0 {
		return &dedupe.ConfigError{Field: "ReaderConfig.Partition", Reason: "must be 0: the group assigns partitions"}
	}
	bmin, bmax := rc.ReadBackoffMin, rc.ReadBackoffMax
	if bmin == 0 {
		bmin = kafkaReadBackoffMin
	}
	if bmax == 0 {
		bmax = kafkaReadBackoffMax
	}
	if bmax < bmin {
		return &dedupe.ConfigError{Field: "ReaderConfig.ReadBackoffMax", Reason: "must be at least ReadBackoffMin"}
	}
	prc := partitionReaderConfig(rc, groupTopics(rc)[0], 0, nil)
	if err := prc.Validate(); err != nil {
		return &dedupe.ConfigError{Field: "ReaderConfig", Reason: err.Error()}
	}
	gc := groupConfig(rc, time.Second, nil)
	if err := gc.Validate(); err != nil {
		return &dedupe.ConfigError{Field: "ReaderConfig", Reason: err.Error()}
	}
	return nil
}

// groupConfig is the consumer-group part of rc. WatchPartitionChanges is
// always on: a partition added, or a topic deleted and recreated, starts a
// new generation whose offsets are read from the group again.
func groupConfig(rc kafka.ReaderConfig, timeout time.Duration, errLog kafka.Logger) kafka.ConsumerGroupConfig {
	return kafka.ConsumerGroupConfig{
		ID:                     rc.GroupID,
		Brokers:                rc.Brokers,
		Dialer:                 rc.Dialer,
		Topics:                 groupTopics(rc),
		GroupBalancers:         rc.GroupBalancers,
		HeartbeatInterval:      rc.HeartbeatInterval,
		PartitionWatchInterval: rc.PartitionWatchInterval,
		WatchPartitionChanges:  true,
		SessionTimeout:         rc.SessionTimeout,
		RebalanceTimeout:       rc.RebalanceTimeout,
		JoinGroupBackoff:       rc.JoinGroupBackoff,
		RetentionTime:          rc.RetentionTime,
		StartOffset:            rc.StartOffset,
		Logger:                 rc.Logger,
		ErrorLogger:            errLog,
		Timeout:                timeout,
	}
}

// partitionReaderConfig is the configuration of the reader of one assigned
// partition: rc's connection and fetch settings, no group. The reader
// reports an offset out of range instead of waiting for it.
func partitionReaderConfig(rc kafka.ReaderConfig, topic string, partition int, errLog kafka.Logger) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers:               rc.Brokers,
		Topic:                 topic,
		Partition:             partition,
		Dialer:                rc.Dialer,
		QueueCapacity:         rc.QueueCapacity,
		MinBytes:              rc.MinBytes,
		MaxBytes:              rc.MaxBytes,
		MaxWait:               rc.MaxWait,
		ReadBatchTimeout:      rc.ReadBatchTimeout,
		ReadLagInterval:       -1,
		ReadBackoffMin:        rc.ReadBackoffMin,
		ReadBackoffMax:        rc.ReadBackoffMax,
		Logger:                rc.Logger,
		ErrorLogger:           errLog,
		IsolationLevel:        rc.IsolationLevel,
		MaxAttempts:           rc.MaxAttempts,
		OffsetOutOfRangeError: true,
	}
}

// kafka-go's error log lines the runner acts on (kafka-go v0.4's wording:
// re-check on upgrades).
const (
	// kafka-go skipped offsets the broker deleted before they were read.
	kafkaLogSkipped = "skipping from offset"
	// kafka-go found its fetch offset past the partition's end, and goes on
	// fetching at that offset. (In v0.4.51 a fetch answered with that error
	// leaves the connection unreadable, so kafka-go reconnects instead and
	// the new reader reports the offset out of range to fetchFailed; this
	// covers a kafka-go that reads the answer through.)
	kafkaLogPastEnd = "reading passed the last offset"
)

// kafkaLogger passes kafka-go's error logs to the runner's logger (and to
// the reader configuration's own ErrorLogger, if any). Most are transient
// (timeouts, reconnections, which kafka-go retries) and logged at debug
// level; kafka-go's report that it skipped offsets the broker deleted before
// they were read (retention) is logged as an error.
//
// A partition reader's logger also calls vanished when kafka-go reports that
// the broker does not know the partition (its topic was deleted), or that
// the offset it fetches is past the partition's end (the topic was
// recreated, or the log truncated, under the reader): kafka-go has no other
// way to tell, and in both cases it would go on fetching at its old offset,
// skipping the new topic's messages before it once they reach it.
type kafkaLogger struct {
	log      *slog.Logger
	next     kafka.Logger
	vanished func()
}

func (l kafkaLogger) Printf(format string, args ...any) {
	if l.vanished != nil && l.lost(format, args) {
		l.vanished()
	}
	msg := strings.TrimSpace(fmt.Sprintf(format, args...))
	if strings.Contains(msg, kafkaLogSkipped) {
		l.log.Error("dedupekafka: kafka-go skipped offsets the broker deleted before they were consumed (retention): those messages are lost", "detail", msg)
	} else {
		l.log.Debug("dedupekafka: kafka-go", "detail", msg)
	}
	if l.next != nil {
		l.next.Printf(format, args...)
	}
}

// lost reports whether a kafka-go log line says the partition being read
// is gone or ends before the reader's offset.
func (kafkaLogger) lost(format string, args []any) bool {
	if strings.Contains(format, kafkaLogPastEnd) {
		return true
	}
	for _, a := range args {
		if err, ok := a.(error); ok && errors.Is(err, kafka.UnknownTopicOrPartition) {
			return true
		}
	}
	return false
}

// errOffsetOutOfRange matches the error a partition reader returns for an
// offset the partition does not hold.
func errOffsetOutOfRange(err error) bool { return errors.Is(err, kafka.OffsetOutOfRange) }
