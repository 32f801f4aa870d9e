package dedupekafka

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestKafkaLoggerActsOnLostPartitions: a partition reader's logger calls
// vanished for kafka-go's lines that say the partition is gone or ends
// before the reader's offset (both would let kafka-go fetch on at its old
// offset in a recreated topic), logs a retention skip as an error, and
// leaves the transient lines at debug level.
func TestKafkaLoggerActsOnLostPartitions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		format   string
		args     []any
		vanished bool
		level    string
	}{
		{"unknown partition", "failed to read from current broker %v for partition %d of %s at offset %d: %v",
			[]any{[]string{"b"}, 0, "orders", int64(5), fmt.Errorf("fetch: %w", kafka.UnknownTopicOrPartition)}, true, "DEBUG"},
		{"past the end", "the kafka reader is reading passed the last offset for partition %d of %s at offset %d",
			[]any{0, "orders", int64(5)}, true, "DEBUG"},
		{"retention skip", "the kafka reader is reading before the first offset for partition %d of %s, skipping from offset %d to %d (%d messages)",
			[]any{0, "orders", int64(2), int64(5), int64(3)}, false, "ERROR"},
		{"timeout", "no messages received from kafka within the allocated time for partition %d of %s at offset %d: %v",
			[]any{0, "orders", int64(5), kafka.RequestTimedOut}, false, "DEBUG"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			calls := 0
			l := kafkaLogger{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})), vanished: func() { calls++ }}
			l.Printf(tc.format, tc.args...)
			if got := calls == 1; got != tc.vanished {
				t.Errorf("vanished called %d times, want called: %v", calls, tc.vanished)
			}
			if !strings.Contains(out.String(), "level="+tc.level) {
				t.Errorf("logged %q, want level %s", out.String(), tc.level)
			}
			// The group reader's logger has no partition to lose.
			kafkaLogger{log: slog.New(slog.DiscardHandler)}.Printf(tc.format, tc.args...)
		})
	}
}
