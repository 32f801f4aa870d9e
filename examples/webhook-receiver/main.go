// Command webhook-receiver receives Stripe, GitHub and Standard Webhooks
// deliveries, verifies their signatures and records each event exactly once
// in the table webhook_events, however often the provider re-sends it, and
// however often anyone replays a signed delivery under other headers: the
// dedup key is the signed event id (Stripe, Standard Webhooks) or, since
// GitHub signs only the body, the body's hash (event_id holds GitHub's
// unsigned delivery id, for reference).
//
//	STRIPE_WEBHOOK_SECRET=whsec_... GITHUB_WEBHOOK_SECRET=... STANDARD_WEBHOOK_SECRET=whsec_... \
//	go run ./examples/webhook-receiver
//
// Environment:
//
//	ADDR                     listen address; defaults to 127.0.0.1:3001
//	DATABASE_URL             PostgreSQL connection string; defaults to
//	                         postgres://postgres@127.0.0.1:5432/test
//	STRIPE_WEBHOOK_SECRET    enables POST /webhooks/stripe
//	GITHUB_WEBHOOK_SECRET    enables POST /webhooks/github
//	STANDARD_WEBHOOK_SECRET  enables POST /webhooks/standard (whsec_<base64>)
//
// At least one secret is required; a route whose secret is unset answers
// 404. GET /healthz answers 200 once the receiver serves. On start it applies the dedupe migrations and creates webhook_events
// if missing.
//
// GET /metrics serves the metrics in Prometheus's format. OpenTelemetry is
// turned on from the standard environment variables (OTEL_TRACES_EXPORTER,
// OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT): a server span per
// delivery, and a process span per event with dedupe.outcome (see
// dedupeotel).
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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
	"github.com/exactlyonce/dedupe/examples/otelkit"
)

// DefaultAddr is where the receiver listens when ADDR is unset.
const DefaultAddr = "127.0.0.1:3001"

// DefaultDatabaseURL is the database used when DATABASE_URL is unset.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// createTable is the receiver's own table: one row per processed event.
const createTable = `CREATE TABLE IF NOT EXISTS webhook_events (
    provider    text        NOT NULL,
    event_id    text        NOT NULL,
    event_type  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
)`

const insertEvent = `INSERT INTO webhook_events (provider, event_id, event_type, received_at) VALUES ($1, $2, $3, now())`

// Secrets are the providers' signing secrets; an empty one leaves its route
// unmounted.
type Secrets struct {
	Stripe   string
	GitHub   string
	Standard string
}

// recordEvent is every route's handler: it runs in the transaction that
// claims the event's key, so the row and the claim commit together.
func recordEvent(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
	_, err := tx.Exec(ctx, insertEvent, ev.Provider, ev.ID, ev.Type)
	return err
}

// Setup migrates the inbox and creates webhook_events.
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, createTable); err != nil {
		return fmt.Errorf("create webhook_events: %w", err)
	}
	return nil
}

// NewMux returns the receiver's routes for the configured secrets; their
// inbox reports to obs (nil for none).
func NewMux(pool *pgxpool.Pool, s Secrets, logger *slog.Logger, obs dedupe.Observer) (*http.ServeMux, error) {
	inbox, err := dedupe.New(pool, dedupe.Config{Logger: logger, Observer: obs})
	if err != nil {
		return nil, err
	}
	cfg := webhook.Config{Logger: logger}
	mux := http.NewServeMux()
	mounted := 0
	mount := func(path string, h *webhook.Handler, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		mux.Handle(path, h) // the handler itself answers 405 to other methods
		logger.Info("webhook route", "path", path, "scope", h.Scope())
		mounted++
		return nil
	}
	if s.Stripe != "" {
		h, err := webhook.NewStripe(inbox, webhook.StripeConfig{Secrets: []string{s.Stripe}, Config: cfg}, recordEvent)
		if err := mount("/webhooks/stripe", h, err); err != nil {
			return nil, err
		}
	}
	if s.GitHub != "" {
		h, err := webhook.NewGitHub(inbox, webhook.GitHubConfig{Secrets: []string{s.GitHub}, Config: cfg}, recordEvent)
		if err := mount("/webhooks/github", h, err); err != nil {
			return nil, err
		}
	}
	if s.Standard != "" {
		h, err := webhook.NewStandard(inbox, webhook.StandardConfig{Secrets: []string{s.Standard}, Config: cfg}, recordEvent)
		if err := mount("/webhooks/standard", h, err); err != nil {
			return nil, err
		}
	}
	if mounted == 0 {
		return nil, errors.New("no route: set STRIPE_WEBHOOK_SECRET, GITHUB_WEBHOOK_SECRET or STANDARD_WEBHOOK_SECRET")
	}
	// Readiness, for scripts and load balancers: a GET on a webhook route
	// answers 405 (and is logged as a refused delivery).
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux, nil
}

// run serves until ctx is cancelled; getenv supplies the configuration.
func run(ctx context.Context, getenv func(string) string, logger *slog.Logger, ready func(addr net.Addr)) error {
	dsn := getenv("DATABASE_URL")
	if dsn == "" {
		dsn = DefaultDatabaseURL
	}
	addr := getenv("ADDR")
	if addr == "" {
		addr = DefaultAddr
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Setup(ctx, pool); err != nil {
		return err
	}
	tel, err := otelkit.Start(ctx, otelkit.Options{Service: "webhook-receiver", Prometheus: true})
	if err != nil {
		return err
	}
	defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()
	mux, err := NewMux(pool, Secrets{
		Stripe:   getenv("STRIPE_WEBHOOK_SECRET"),
		GitHub:   getenv("GITHUB_WEBHOOK_SECRET"),
		Standard: getenv("STANDARD_WEBHOOK_SECRET"),
	}, logger, tel.Observer)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           tel.Handler(mux),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("listening", "addr", ln.Addr().String())
	if ready != nil {
		ready(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, logger, nil); err != nil {
		logger.Error("webhook-receiver", "err", err)
		os.Exit(1)
	}
}
