package dedupeotel

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe"
)

// StartHandle starts the "process" span of a message's handling (see the
// package documentation for its parent and link) and returns its context,
// in which the claim and the handler run; done ends it, with the outcome,
// and counts the handling.
func (o *Observer) StartHandle(ctx context.Context, h dedupe.HandleInfo) (context.Context, func(dedupe.HandleDone)) {
	m := &h.Message
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		ScopeKey.String(h.Key.Scope),
		ModeKey.String(h.Mode),
	)
	attrs = appendMessage(attrs, m, h.Key.ID)
	target := m.Destination
	if target == "" {
		target = h.Key.Scope
	}
	parent, link := o.parent(ctx, m.Headers, m.Untrusted)
	ctx, span := o.start(parent, "process "+target, trace.SpanKindConsumer, attrs, link)
	return ctx, func(d dedupe.HandleDone) {
		outcome := outcomeName(d.Outcome)
		if span.IsRecording() {
			end := make([]attribute.KeyValue, 0, 3)
			end = append(end, OutcomeKey.String(outcome))
			if d.Attempt > 0 {
				end = append(end, AttemptKey.Int(d.Attempt))
			}
			failed := d.Err != nil && d.Outcome != dedupe.OutcomeInFlight
			if failed {
				end = append(end, errorType(outcome, d.Err))
			}
			span.SetAttributes(end...)
			if failed {
				span.RecordError(d.Err)
				span.SetStatus(codes.Error, d.Err.Error())
			}
		}
		span.End()
		set := metric.WithAttributeSet(o.handleSet(h.Key.Scope, h.Mode, outcome, m.System))
		o.m.claims.Add(ctx, 1, set)
		o.m.handleDuration.Record(ctx, d.Duration.Seconds(), set)
	}
}

// start starts a span with attrs and, when valid, a link.
func (o *Observer) start(ctx context.Context, name string, kind trace.SpanKind, attrs []attribute.KeyValue, link trace.Link) (context.Context, trace.Span) {
	var buf [3]trace.SpanStartOption
	opts := append(buf[:0], trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	if link.SpanContext.IsValid() {
		opts = append(opts, trace.WithLinks(link))
	}
	return o.tracer.Start(ctx, name, opts...)
}

// setKey identifies the attribute set of a handling's metrics.
type setKey struct{ scope, mode, outcome, system string }

// handleSet is the attribute set of a handling's metrics, built once per
// combination (scopes, modes, outcomes and systems are few).
func (o *Observer) handleSet(scope, mode, outcome, system string) attribute.Set {
	k := setKey{scope, mode, outcome, system}
	if s, ok := o.sets.Load(k); ok {
		return s.(attribute.Set)
	}
	attrs := []attribute.KeyValue{ScopeKey.String(scope), ModeKey.String(mode), OutcomeKey.String(outcome)}
	if system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(system))
	}
	s := attribute.NewSet(attrs...)
	o.sets.Store(k, s)
	return s
}

// appendMessage appends what the transport knows of m. The message id is
// the transport's, else the dedup key's id.
func appendMessage(attrs []attribute.KeyValue, m *dedupe.MessageInfo, keyID string) []attribute.KeyValue {
	if m.System != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(m.System))
	}
	if m.Destination != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(m.Destination))
	}
	id := m.ID
	if id == "" {
		id = keyID
	}
	if id != "" {
		attrs = append(attrs, semconv.MessagingMessageID(id))
	}
	if m.Group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(m.Group))
	}
	if m.System == "kafka" && m.Partition >= 0 {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(m.Partition)),
			semconv.MessagingKafkaOffset(int(m.Offset)))
	}
	if m.Delivery > 0 {
		attrs = append(attrs, DeliveryKey.Int(m.Delivery))
	}
	return attrs
}

// parent returns the context a message's span starts in and the link to its
// creation context (invalid when its headers carry none). The creation
// context, extracted from h, is the parent unless ctx holds a live local
// span, which then stays the parent; baggage from h is kept either way.
//
// For an untrusted message (MessageInfo.Untrusted) the creation context is
// only linked: the span starts under ctx's live local span if it has one,
// else in a new trace (a remote span context in ctx came from the same
// sender and is dropped), and h's baggage is not read at all.
func (o *Observer) parent(ctx context.Context, h dedupe.Headers, untrusted bool) (context.Context, trace.Link) {
	if untrusted {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && sc.IsRemote() {
			ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
		}
		if h == nil {
			return ctx, trace.Link{}
		}
		sc := trace.SpanContextFromContext(o.prop.Extract(context.Background(), carrier{h, o.canon}))
		if !sc.IsValid() {
			return ctx, trace.Link{}
		}
		return ctx, trace.Link{SpanContext: sc}
	}
	if h == nil {
		return ctx, trace.Link{}
	}
	local := trace.SpanContextFromContext(ctx)
	extracted := o.prop.Extract(ctx, carrier{h, o.canon})
	sc := trace.SpanContextFromContext(extracted)
	if !sc.IsValid() || sc.Equal(local) {
		return extracted, trace.Link{}
	}
	link := trace.Link{SpanContext: sc}
	if local.IsValid() && !local.IsRemote() {
		return trace.ContextWithSpan(extracted, trace.SpanFromContext(ctx)), link
	}
	return extracted, link
}

// outcomeName is the value of OutcomeKey for o.
func outcomeName(o dedupe.Outcome) string {
	if o == 0 {
		return OutcomeError
	}
	return o.String()
}

// errorType is the error.type of a failed handling: its outcome, or the
// error's type when it failed before one.
func errorType(outcome string, err error) attribute.KeyValue {
	if outcome != OutcomeError {
		return semconv.ErrorTypeKey.String(outcome)
	}
	return semconv.ErrorType(err)
}

// LeaseRenewed counts a renewal by KeepAlive and adds an event to the span
// in ctx, if any.
func (o *Observer) LeaseRenewed(ctx context.Context, key dedupe.Key, err error) {
	res := resultAttr(err)
	o.m.leaseRenewals.Add(ctx, 1, metric.WithAttributes(res))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("dedupe.lease.renewed", trace.WithAttributes(res))
	}
}

// LeaseLost counts a lease KeepAlive gave up on and records it on the span
// in ctx, if any.
func (o *Observer) LeaseLost(ctx context.Context, key dedupe.Key, err error) {
	o.m.leaseLost.Add(ctx, 1)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		attrs := []attribute.KeyValue{ScopeKey.String(key.Scope)}
		if err != nil {
			attrs = append(attrs, attribute.String("exception.message", err.Error()))
		}
		span.AddEvent("dedupe.lease.lost", trace.WithAttributes(attrs...))
	}
}

// Purged counts a purge and the keys it deleted.
func (o *Observer) Purged(ctx context.Context, deleted int64, err error) {
	o.m.purges.Add(ctx, 1, metric.WithAttributes(resultAttr(err)))
	if deleted > 0 {
		o.m.purgeDeleted.Add(ctx, deleted)
	}
}

// TransportEvent counts e by name and system, and adds it as an event to the
// span in ctx, if any.
func (o *Observer) TransportEvent(ctx context.Context, e dedupe.TransportEvent) {
	n := int64(e.Count)
	if n <= 0 {
		n = 1
	}
	attrs := []attribute.KeyValue{EventKey.String(e.Name)}
	if e.Message.System != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(e.Message.System))
	}
	o.m.transportEvents.Add(ctx, n, metric.WithAttributes(attrs...))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		if e.Err != nil {
			attrs = append(attrs, attribute.String("exception.message", e.Err.Error()))
		}
		span.AddEvent("dedupe.transport."+e.Name, trace.WithAttributes(attrs...))
	}
}

func resultAttr(err error) attribute.KeyValue {
	if err != nil {
		return ResultKey.String("error")
	}
	return ResultKey.String("ok")
}
