package webhook_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
	"github.com/exactlyonce/dedupe/internal/adaptertest"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// sender simulates a provider: it delivers each published event over HTTP,
// signed as Standard Webhooks senders (Svix) sign, with the suite's id as
// webhook-id, and re-sends it, signed anew, with backoff on any non-2xx
// answer or transport error until it gets a 2xx or gives up after maxTries,
// as providers do. (GitHub cannot stand in: its key is the body's hash, not
// the id the suite publishes.)
type sender struct {
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []delivery
	pending int // queued or being delivered
	closed  bool
}

type delivery struct {
	id   string
	body []byte
}

const maxTries = 8

func newSender() *sender {
	s := &sender{}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *sender) publish(id string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, delivery{id, bytes.Clone(body)})
	s.pending++
	s.cond.Signal()
}

// next blocks for the next delivery; ok is false once closed.
func (s *sender) next() (d delivery, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.queue) == 0 && !s.closed {
		s.cond.Wait()
	}
	if s.closed {
		return delivery{}, false
	}
	d, s.queue = s.queue[0], s.queue[1:]
	return d, true
}

func (s *sender) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending--
}

func (s *sender) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.cond.Broadcast()
}

// deliver sends d until a 2xx, maxTries or ctx ends.
func (s *sender) deliver(ctx context.Context, url string, d delivery) {
	defer s.done()
	backoff := 10 * time.Millisecond
	for range maxTries {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(d.body))
		if err != nil {
			return
		}
		ts := time.Now()
		req.Header.Set("Webhook-Id", d.id)
		req.Header.Set("Webhook-Timestamp", strconv.FormatInt(ts.Unix(), 10))
		req.Header.Set("Webhook-Signature", standardHeader(standardSecret, d.id, ts, d.body))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, adaptertest.Transport{
		Name:     "webhook",
		Features: adaptertest.Features{Poison: true},
		New: func(t *testing.T, _ *dbtest.DB) adaptertest.Instance {
			s := newSender()
			return adaptertest.Instance{
				Publish: func(_ context.Context, id string, body []byte) error { s.publish(id, body); return nil },
				Unacked: func(context.Context) (int, error) {
					s.mu.Lock()
					defer s.mu.Unlock()
					return s.pending, nil
				},
				Start:    start[pgx.Tx](t, s),
				StartSQL: start[*sql.Tx](t, s),
			}
		},
	})
}

// start serves a Standard Webhooks handler whose handler, of the inbox
// driver's transaction type TTx, runs the suite's effect, and has cfg.Workers
// senders deliver s's events to it.
func start[TTx any](t *testing.T, s *sender) func(ctx context.Context, inbox *dedupe.Inbox, cfg adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
	return func(ctx context.Context, inbox *dedupe.Inbox, cfg adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
		h, err := webhook.NewStandard(inbox, webhook.StandardConfig{Secrets: []string{standardSecret},
			Config: webhook.Config{MaxAttempts: cfg.MaxAttempts, OnError: func(*http.Request, int, error) {}}},
			func(ctx context.Context, tx TTx, ev webhook.Event) error { return effect(ctx, tx, ev.ID, ev.Body) })
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		var wg sync.WaitGroup
		for range max(cfg.Workers, 1) {
			wg.Go(func() {
				for {
					d, ok := s.next()
					if !ok {
						return
					}
					s.deliver(ctx, srv.URL, d)
				}
			})
		}
		stopped := make(chan struct{})
		go func() {
			<-ctx.Done()
			s.close()
			close(stopped)
		}()
		return func() error {
			<-stopped
			wg.Wait()
			srv.Close()
			http.DefaultClient.CloseIdleConnections()
			return nil
		}
	}
}

// TestHandlerTxTypeMustMatchDriver: a handler receives the inbox driver's
// transaction, so a pgx.Tx handler on an inbox over dedupe.SQL (or a
// *sql.Tx handler on one over pgx) is refused at construction.
func TestHandlerTxTypeMustMatchDriver(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t, dbtest.Options{MaxConns: 2})
	sqlDB, err := sql.Open("pgx", db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	overSQL, err := dedupe.New(dedupe.SQL(sqlDB), dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	overPgx, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := webhook.StandardConfig{Secrets: []string{standardSecret}}
	var ce *dedupe.ConfigError
	_, err = webhook.NewStandard(overSQL, cfg, func(context.Context, pgx.Tx, webhook.Event) error { return nil })
	if !errors.As(err, &ce) || ce.Field != "handler" {
		t.Errorf("pgx.Tx handler over dedupe.SQL: err = %v, want a *dedupe.ConfigError for handler", err)
	}
	_, err = webhook.NewStandard(overPgx, cfg, func(context.Context, *sql.Tx, webhook.Event) error { return nil })
	if !errors.As(err, &ce) || ce.Field != "handler" {
		t.Errorf("*sql.Tx handler over pgx: err = %v, want a *dedupe.ConfigError for handler", err)
	}
	if _, err := webhook.NewStandard(overSQL, cfg, func(context.Context, *sql.Tx, webhook.Event) error { return nil }); err != nil {
		t.Errorf("*sql.Tx handler over dedupe.SQL: %v", err)
	}
}
