package dedupeotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// Enqueued marks the creation of an outbox message with a "create" span in
// ctx's trace (a new trace when ctx has none) and injects that span's
// context into msg's headers, with which it is stored and published.
func (o *Observer) Enqueued(ctx context.Context, msg *outbox.Message) {
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs,
		semconv.MessagingOperationTypeCreate,
		semconv.MessagingOperationName("create"),
		semconv.MessagingDestinationName(msg.Topic),
		semconv.MessagingMessageID(msg.ID),
	)
	if o.cfg.OutboxSystem != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(o.cfg.OutboxSystem))
	}
	ctx, span := o.tracer.Start(ctx, "create "+msg.Topic,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	if msg.Headers == nil {
		msg.Headers = map[string][]string{}
	}
	o.prop.Inject(ctx, carrier{dedupe.MapHeaders(msg.Headers), o.canon})
	span.End()
	o.m.enqueued.Add(ctx, 1)
}

// StartPublish starts the "send" span of one relay publish of msg, a child
// of (and linked to) the creation context in its headers; done ends it and
// counts the publish, and records the lag of a confirmed one.
func (o *Observer) StartPublish(ctx context.Context, msg *outbox.StoredMessage) (context.Context, func(outbox.PublishDone)) {
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		semconv.MessagingDestinationName(msg.Topic),
		semconv.MessagingMessageID(msg.ID),
		AttemptKey.Int(msg.Attempt),
	)
	if o.cfg.OutboxSystem != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(o.cfg.OutboxSystem))
	}
	var headers dedupe.Headers
	if msg.Headers != nil {
		headers = dedupe.MapHeaders(msg.Headers)
	}
	parent, link := o.parent(ctx, headers, false) // the outbox's rows are the program's own
	ctx, span := o.start(parent, "send "+msg.Topic, trace.SpanKindProducer, attrs, link)
	return ctx, func(d outbox.PublishDone) {
		outcome := PublishPublished
		switch {
		case d.Parked:
			outcome = PublishParked
		case d.Err != nil:
			outcome = PublishFailed
		}
		if span.IsRecording() {
			if d.Err == nil {
				span.SetAttributes(OutcomeKey.String(outcome))
			} else {
				span.SetAttributes(OutcomeKey.String(outcome), semconv.ErrorTypeKey.String(outcome))
				span.RecordError(d.Err)
				span.SetStatus(codes.Error, d.Err.Error())
			}
		}
		span.End()
		o.m.publishes.Add(ctx, 1, metric.WithAttributes(OutcomeKey.String(outcome)))
		if d.Err == nil {
			o.m.publishLag.Record(ctx, d.Lag.Seconds())
		}
	}
}

// Discarded counts a message an operator discarded.
func (o *Observer) Discarded(ctx context.Context, _ *outbox.StoredMessage, _, _ string) {
	o.m.discarded.Add(ctx, 1)
}

// OutboxQueued keeps the relay's report for the outbox gauges.
func (o *Observer) OutboxQueued(_ context.Context, s outbox.Stats) {
	o.queued.Store(&s)
}
