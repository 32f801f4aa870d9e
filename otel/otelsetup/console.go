package otelsetup

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// consoleExporter prints one short line per span, as the span ends, for
// OTEL_TRACES_EXPORTER=console: the time, the trace's and the span's ids
// (8 hex digits each, enough to follow a trace by eye) and the parent's,
// the kind, the duration, the name, and the attributes that say what
// happened (consoleAttrs), e.g.
//
//	12:00:01.532 trace 4bf92f35 span 00f067aa <- 53995c3f consumer  1.9ms process orders.created dedupe.outcome=claimed dedupe.attempt=1
//
// The SDK's stdout exporter prints each span as a line of JSON of about a
// kilobyte; OTEL_EXPORTER_CONSOLE_FORMAT=json restores it.
type consoleExporter struct {
	mu sync.Mutex
	w  io.Writer
}

// consoleAttrs are the attributes a console line shows.
var consoleAttrs = map[attribute.Key]bool{"dedupe.outcome": true, "dedupe.attempt": true, "dedupe.delivery": true,
	"error.type": true, "order.id": true}

func (e *consoleExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	var b strings.Builder
	for _, s := range spans {
		writeSpanLine(&b, s)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err := io.WriteString(e.w, b.String())
	return err
}

func (e *consoleExporter) Shutdown(context.Context) error { return nil }

// writeSpanLine writes s as one line.
func writeSpanLine(b *strings.Builder, s sdktrace.ReadOnlySpan) {
	sc := s.SpanContext()
	parent := "root    "
	if p := s.Parent(); p.IsValid() {
		parent = "<- " + shortID(p.SpanID().String())
	}
	fmt.Fprintf(b, "%s trace %s span %s %s %-8s %7s %s",
		s.EndTime().Format("15:04:05.000"), shortID(sc.TraceID().String()), shortID(sc.SpanID().String()),
		parent, kindName(s.SpanKind()), roundDuration(s.EndTime().Sub(s.StartTime())), s.Name())
	for _, kv := range s.Attributes() {
		if consoleAttrs[kv.Key] {
			fmt.Fprintf(b, " %s=%s", kv.Key, attrValue(kv.Value))
		}
	}
	if st := s.Status(); st.Code == codes.Error {
		fmt.Fprintf(b, " error=%q", st.Description)
	}
	if n := len(s.Links()); n > 0 {
		fmt.Fprintf(b, " links=%d", n)
	}
	b.WriteByte('\n')
}

func shortID(id string) string { return id[:8] }

func attrValue(v attribute.Value) string {
	s := v.Emit()
	if strings.ContainsAny(s, " \t\n\"") {
		return fmt.Sprintf("%q", s)
	}
	return s
}

func kindName(k trace.SpanKind) string {
	if k == trace.SpanKindUnspecified {
		return "internal"
	}
	return k.String()
}

// roundDuration keeps three significant digits.
func roundDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}
