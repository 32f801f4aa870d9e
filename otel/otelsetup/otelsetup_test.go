package otelsetup_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/otel/otelsetup"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestConsoleTraces: OTEL_TRACES_EXPORTER=console prints each span on
// standard output as one short line (its trace's id, its name, the dedupe
// attributes, its error), its parent's id on its children's lines;
// OTEL_EXPORTER_CONSOLE_FORMAT=json prints the SDK's JSON instead, with the
// resource. The program is this test binary run again (the exporter writes
// to the process's standard output).
func TestConsoleTraces(t *testing.T) {
	if os.Getenv("OTELSETUP_CHILD") == "1" {
		consoleChild()
		return
	}
	child := func(format string) (out, traceID, parentID string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestConsoleTraces$")
		cmd.Env = append(os.Environ(), "OTELSETUP_CHILD=1", "OTEL_TRACES_EXPORTER=console", "OTEL_METRICS_EXPORTER=",
			"OTEL_SERVICE_NAME=from-env", "OTEL_EXPORTER_CONSOLE_FORMAT="+format)
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, b)
		}
		out = string(b)
		_, rest, ok := strings.Cut(out, "trace id ")
		if !ok {
			t.Fatalf("the child printed no trace id:\n%s", out)
		}
		ids, _, _ := strings.Cut(rest, "\n")
		traceID, parentID, _ = strings.Cut(ids, " parent ")
		return out, traceID, parentID
	}

	out, traceID, parentID := child("")
	lines := strings.Split(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(out), "PASS")), "\n")
	if len(lines) != 3 { // the ids, the child span, the parent span (then the child test's PASS)
		t.Fatalf("want the ids and two span lines, got:\n%s", out)
	}
	for _, l := range lines[1:] {
		if len(l) > 200 {
			t.Errorf("span line of %d bytes, want a short one: %s", len(l), l)
		}
	}
	for _, want := range []string{
		" trace " + traceID[:8] + " span ", " <- " + parentID[:8] + " consumer ",
		" process orders dedupe.outcome=retry dedupe.attempt=2 error.type=timeout error=\"warehouse timed out\"",
	} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("child span line lacks %q:\n%s", want, lines[1])
		}
	}
	if want := " trace " + traceID[:8] + " span " + parentID[:8] + " root     internal "; !strings.Contains(lines[2], want) || !strings.HasSuffix(lines[2], " place order") {
		t.Errorf("parent span line lacks %q or its name:\n%s", want, lines[2])
	}

	out, traceID, _ = child("json")
	for _, want := range []string{`"Name":"place order"`, `"TraceID":"` + traceID + `"`, `"Value":"from-env"`} {
		if !strings.Contains(out, want) {
			t.Errorf("JSON console output lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "default-name") {
		t.Errorf("OTEL_SERVICE_NAME did not override the default service name")
	}
}

func consoleChild() {
	tel, err := otelsetup.Start(context.Background(), otelsetup.Config{ServiceName: "default-name"})
	if err != nil {
		panic(err)
	}
	if _, ok := tel.TracerProvider.(*sdktrace.TracerProvider); !ok || otel.GetTracerProvider() != tel.TracerProvider {
		panic(fmt.Sprintf("tracer provider %T not the SDK's, or not global", tel.TracerProvider))
	}
	ctx, parent := otel.Tracer("test").Start(context.Background(), "place order")
	_, span := otel.Tracer("test").Start(ctx, "process orders", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("dedupe.outcome", "retry"), attribute.Int("dedupe.attempt", 2),
			attribute.String("error.type", "timeout"), attribute.String("messaging.system", "nats")))
	span.SetStatus(codes.Error, "warehouse timed out")
	fmt.Printf("trace id %s parent %s\n", span.SpanContext().TraceID(), parent.SpanContext().SpanID())
	span.End()
	parent.End()
	if err := tel.Shutdown(context.Background()); err != nil {
		panic(err)
	}
}

// TestUnsetIsNone: without the variables nothing is exported and no SDK is
// installed; the Prometheus handler still serves what is recorded.
func TestUnsetIsNone(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_METRICS_EXPORTER", "")
	before := otel.GetTracerProvider()
	tel, err := otelsetup.Start(context.Background(), otelsetup.Config{Prometheus: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	if tel.TracerProvider != before {
		t.Errorf("a tracer provider was installed without OTEL_TRACES_EXPORTER")
	}
	if _, ok := tel.MeterProvider.(*sdkmetric.MeterProvider); !ok {
		t.Fatalf("meter provider %T, want the SDK's for the Prometheus reader", tel.MeterProvider)
	}
	c, err := otel.Meter("test").Int64Counter("dedupe.claims")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 3)
	rec := httptest.NewRecorder()
	tel.MetricsHandler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body := rec.Body.String(); !strings.Contains(body, "dedupe_claims_total") || !bytes.Contains(rec.Body.Bytes(), []byte(" 3")) {
		t.Errorf("/metrics:\n%s", body)
	}
}

// TestUnknownExporter is refused.
func TestUnknownExporter(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
	if _, err := otelsetup.Start(context.Background(), otelsetup.Config{}); err == nil {
		t.Fatal("an unknown exporter was accepted")
	}
}
