package test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	dedupewatermill "github.com/exactlyonce/dedupe/adapters/watermill"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// env is a fresh schema with an effects table and an inbox.
type env struct {
	db    *dbtest.DB
	inbox *dedupe.Inbox
}

func setup(t *testing.T, obs dedupe.Observer) *env {
	t.Helper()
	db := dbtest.New(t)
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_id text NOT NULL, body bytea)`)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return &env{db: db, inbox: inbox}
}

func (e *env) effects(t *testing.T) int {
	t.Helper()
	return e.db.Count(t, "SELECT count(*) FROM effects")
}

// insertEffect is a Watermill handler writing one effect row through the
// middleware's transaction.
func insertEffect(msg *message.Message) error {
	tx, ok := dedupewatermill.Tx[pgx.Tx](msg.Context())
	if !ok {
		return fmt.Errorf("no transaction in the message's context")
	}
	_, err := tx.Exec(msg.Context(), "INSERT INTO effects (msg_id, body) VALUES ($1, $2)",
		dedupe.ClaimFromContext(msg.Context()).Key.ID, []byte(msg.Payload))
	return err
}

// router starts a router with the dedupe middleware mw (plus extra
// middlewares before it) and one handler from sub's topic to h, and stops it
// when the test ends or stop is called.
func router(t *testing.T, mw *dedupewatermill.Middleware, sub message.Subscriber, topic string, h message.HandlerFunc, pub message.Publisher, pubTopic string, extra ...message.HandlerMiddleware) (stop func()) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wmLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(extra...)
	r.AddMiddleware(mw.Handler)
	if pub == nil {
		r.AddNoPublisherHandler("h", topic, sub, func(msg *message.Message) error {
			_, err := h(msg)
			return err
		})
	} else {
		r.AddHandler("h", topic, sub, pubTopic, pub, h)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start in 30s")
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := r.Close(); err != nil {
				t.Errorf("close router: %v", err)
			}
			if err := <-done; err != nil {
				t.Errorf("router: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func noPublish(h func(*message.Message) error) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
}

// wmLogger logs Watermill through t.Log at info level.
func wmLogger(t *testing.T) watermill.LoggerAdapter {
	return watermill.NewSlogLogger(slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func newMiddleware(t *testing.T, e *env, cfg dedupewatermill.Config) *dedupewatermill.Middleware {
	t.Helper()
	if cfg.Scope == "" {
		cfg.Scope = "shipping"
	}
	mw, err := dedupewatermill.New[pgx.Tx](e.inbox, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}
