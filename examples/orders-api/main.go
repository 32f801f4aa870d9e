// Command orders-api is a small HTTP API whose order creation is idempotent
// per Idempotency-Key, built on httpidem.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go run ./examples/orders-api
//
// It listens on $ADDR (default 127.0.0.1:3000) and creates its tables on
// start. The tenant comes from the X-Tenant-ID header, a stand-in for real
// authentication that runs before the idempotency layer (missing → 401).
//
//	POST /orders        {"cart_id": "...", "total_cents": 1900} → 201 {"id": ...}
//	                    Idempotency-Key required; retries replay the 201
//	                    (the key, the order and the stored 201 commit in
//	                    one transaction).
//	GET  /orders/{id}   → 200 with ETag (304 for a matching If-None-Match)
//	PUT  /orders/{id}   {"cart_id": "...", "total_cents": ...} with If-Match
//	                    → 200 with the new ETag, 412 stale, 428 missing
//	GET  /metrics       the metrics, in Prometheus's format
//
// OpenTelemetry is turned on from the standard environment variables
// (OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT):
// a server span per request, in the trace of the client's traceparent, and
// the idempotency layer's spans and metrics (see dedupeotel).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/examples/otelkit"
)

// Defaults of the environment.
const (
	defaultAddr        = "127.0.0.1:3000"
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	addr := envOr("ADDR", defaultAddr)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("listen", "addr", addr, "err", err)
		os.Exit(1)
	}
	if err := run(ctx, ln, envOr("DATABASE_URL", defaultDatabaseURL), log); err != nil {
		log.Error("orders-api stopped", "err", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// run connects to the database, creates the tables, serves on ln until ctx
// ends, then shuts down gracefully.
func run(ctx context.Context, ln net.Listener, databaseURL string, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	tel, err := otelkit.Start(ctx, otelkit.Options{Service: "orders-api", Prometheus: true})
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()
	app, err := newApp(ctx, pool, log, tel.Observer)
	if err != nil {
		_ = ln.Close()
		return err
	}
	srv := &http.Server{Handler: tel.Handler(app.routes()), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}

	purgeDone := make(chan struct{})
	go func() {
		defer close(purgeDone)
		_ = app.idem.RunPurger(ctx, 0)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("orders-api listening", "addr", ln.Addr().String())

	select {
	case err = <-serveErr:
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = srv.Shutdown(shutdownCtx)
		cancel()
		<-serveErr
	}
	<-purgeDone
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
