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
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/otel/otelsetup"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestConsoleTraces: OTEL_TRACES_EXPORTER=console prints the spans, with
// their trace id, on standard output when the program shuts down. The
// program is this test binary run again (the exporter writes to the
// process's standard output).
func TestConsoleTraces(t *testing.T) {
	if os.Getenv("OTELSETUP_CHILD") == "1" {
		consoleChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConsoleTraces$")
	cmd.Env = append(os.Environ(), "OTELSETUP_CHILD=1", "OTEL_TRACES_EXPORTER=console", "OTEL_METRICS_EXPORTER=",
		"OTEL_SERVICE_NAME=from-env")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	_, rest, ok := strings.Cut(string(out), "trace id ")
	if !ok {
		t.Fatalf("the child printed no trace id:\n%s", out)
	}
	traceID, _, _ := strings.Cut(rest, "\n")
	for _, want := range []string{`"Name":"enqueue order"`, `"TraceID":"` + traceID + `"`, `"Value":"from-env"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("console output lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "default-name") {
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
	_, span := otel.Tracer("test").Start(context.Background(), "enqueue order")
	fmt.Printf("trace id %s\n", span.SpanContext().TraceID())
	span.End()
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
