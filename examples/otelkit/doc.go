// Package otelkit turns OpenTelemetry on in the examples: the SDK from the
// standard OTEL_* environment variables (otelsetup), and a dedupe Observer
// reporting to it. examples/telemetry shows it at work:
//
//	go run ./examples/telemetry
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp go run ./examples/orders-api
//
// The examples that serve HTTP also serve their metrics at GET /metrics in
// Prometheus's format, through the OTel Prometheus exporter.
//
// It is a library that the examples share, not an example: there is nothing
// to run here (the programs are the directories of examples/ that have a
// README).
package otelkit
