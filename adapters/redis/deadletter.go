package deduperedis

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
)

// Fields of a copy added to Config.DeadLetterStream, besides the entry's own
// fields.
const (
	// DeadLetterReasonField says why the runner gave up on the entry.
	DeadLetterReasonField = "dedupe-reason"
	// DeadLetterStreamField and DeadLetterIDField locate the original entry.
	DeadLetterStreamField = "dedupe-stream"
	DeadLetterIDField     = "dedupe-entry-id"
	// DeadLetterGroupField is the consumer group that gave up on it.
	DeadLetterGroupField = "dedupe-group"
	// DeadLetterDeliveriesField is how often the group had delivered it
	// (0 when unknown).
	DeadLetterDeliveriesField = "dedupe-deliveries"
	// DeadLetterKeyField is the inbox key it is recorded failed under: its
	// dedup key, or its RefusedKey.
	DeadLetterKeyField = "dedupe-key"
	// DeadLetterTrimmedField is "true" for an entry whose body was deleted
	// from the stream while it was pending: the copy then has no fields of
	// its own.
	DeadLetterTrimmedField = "dedupe-trimmed"
)

// maxReason bounds the reason written to a dead-letter copy.
const maxReason = 500

// deadLetterAck adds a copy of m to Config.DeadLetterStream, when set, and
// acknowledges m, in one MULTI/EXEC: a crash cannot leave a copy without
// the ack (which would add a second copy when the entry is reclaimed) or
// the ack without the copy.
func (r *Runner) deadLetterAck(ctx context.Context, m *Message, key dedupe.Key, cause error) error {
	actx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	if r.cfg.DeadLetterStream == "" {
		return r.rdb.XAck(actx, r.stream, r.group, m.ID).Err()
	}
	_, err := r.rdb.TxPipelined(actx, func(p redis.Pipeliner) error {
		p.XAdd(actx, &redis.XAddArgs{Stream: r.cfg.DeadLetterStream, Values: r.deadLetterFields(m, key, cause)})
		p.XAck(actx, r.stream, r.group, m.ID)
		return nil
	})
	return err
}

// deadLetterFields are the fields of m's dead-letter copy.
func (r *Runner) deadLetterFields(m *Message, key dedupe.Key, cause error) []any {
	out := make([]any, 0, 2*len(m.Values)+16)
	for k, v := range m.Values {
		if strings.HasPrefix(k, "dedupe-") {
			continue
		}
		out = append(out, k, v)
	}
	reason := "deduperedis: gave up"
	if cause != nil {
		reason = cause.Error()
	}
	if len(reason) > maxReason {
		reason = strings.ToValidUTF8(reason[:maxReason], "")
	}
	out = append(out,
		DeadLetterReasonField, reason,
		DeadLetterStreamField, m.Stream,
		DeadLetterIDField, m.ID,
		DeadLetterGroupField, r.group,
		DeadLetterDeliveriesField, strconv.FormatInt(m.Deliveries, 10),
		DeadLetterKeyField, key.ID,
	)
	if m.gone {
		out = append(out, DeadLetterTrimmedField, "true")
	}
	return out
}
