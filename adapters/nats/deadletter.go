package dedupenats

import (
	"context"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of a copy published to Config.DeadLetterSubject, besides the
// original message's own headers (its Nats-* headers are dropped, so that
// they do not steer the publish, and its Nats-Msg-Id is kept as
// DeadLetterMsgIDHeader).
const (
	// DeadLetterReasonHeader says why the runner gave up on the message.
	DeadLetterReasonHeader = "Dedupe-Reason"
	// DeadLetterSubjectHeader is the message's original subject.
	DeadLetterSubjectHeader = "Dedupe-Subject"
	// DeadLetterStreamHeader and DeadLetterSequenceHeader locate the original
	// in its stream.
	DeadLetterStreamHeader   = "Dedupe-Stream"
	DeadLetterSequenceHeader = "Dedupe-Stream-Sequence"
	// DeadLetterConsumerHeader is the consumer that gave up on it.
	DeadLetterConsumerHeader = "Dedupe-Consumer"
	// DeadLetterDeliveriesHeader is how often it had been delivered.
	DeadLetterDeliveriesHeader = "Dedupe-Deliveries"
	// DeadLetterKeyHeader is its dedup key, when it had one.
	DeadLetterKeyHeader = "Dedupe-Key"
	// DeadLetterMsgIDHeader is its original Nats-Msg-Id, when it had one.
	DeadLetterMsgIDHeader = "Dedupe-Msg-Id"
)

// deadLetter publishes a copy of msg to Config.DeadLetterSubject and waits
// for the stream's acknowledgement. The copy's Nats-Msg-Id names the original
// stream message and consumer, so a copy published again after a crash (or
// by a second try) is dropped by the dead-letter stream's duplicate window.
func (r *Runner) deadLetter(ctx context.Context, d *delivery, cause error) error {
	msg := d.msg
	m := nats.NewMsg(r.cfg.DeadLetterSubject)
	m.Data = msg.Data()
	for k, vs := range msg.Headers() {
		if strings.HasPrefix(strings.ToLower(k), "nats-") {
			continue
		}
		m.Header[k] = append([]string(nil), vs...)
	}
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		m.Header.Set(DeadLetterMsgIDHeader, id)
	}
	reason := "dedupe: gave up"
	if cause != nil {
		reason = cause.Error()
	}
	m.Header.Set(DeadLetterReasonHeader, truncate(reason))
	m.Header.Set(DeadLetterSubjectHeader, msg.Subject())
	if d.key.ID != "" {
		m.Header.Set(DeadLetterKeyHeader, d.key.ID)
	}
	if meta, err := msg.Metadata(); err == nil {
		seq := strconv.FormatUint(meta.Sequence.Stream, 10)
		m.Header.Set(DeadLetterStreamHeader, meta.Stream)
		m.Header.Set(DeadLetterSequenceHeader, seq)
		m.Header.Set(DeadLetterConsumerHeader, meta.Consumer)
		m.Header.Set(DeadLetterDeliveriesHeader, strconv.FormatUint(meta.NumDelivered, 10))
		m.Header.Set(jetstream.MsgIDHeader, "dedupe-dlq:"+meta.Stream+":"+meta.Consumer+":"+seq)
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	_, err := r.cfg.DeadLetterJS.PublishMsg(pctx, m)
	return err
}

// truncate bounds a reason sent with Term or in a header.
func truncate(reason string) string {
	if len(reason) > maxReason {
		return strings.ToValidUTF8(reason[:maxReason], "")
	}
	return reason
}
