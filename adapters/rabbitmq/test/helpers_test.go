package test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	"github.com/exactlyonce/dedupe/internal/amqptest"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

const orderIDHdr = "Order-Id"

// bundle is what setup gives each test: a fresh schema with an effects
// table, an inbox, a connection to the broker, and a queue of its own with
// a dead-letter queue behind its dead-letter exchange.
type bundle struct {
	db    *dbtest.DB
	inbox *dedupe.Inbox
	conn  *amqp.Connection
	ch    *amqp.Channel // for publishing
	queue string
	dlq   string // bound to the queue's x-dead-letter-exchange ("" routing to it)
}

type setupOpts struct {
	db            *dbtest.DB // Defaults to a new schema.
	quorum        bool       // a quorum queue rather than a classic one
	deliveryLimit int        // the quorum queue's x-delivery-limit, 0 for none
	noDLX         bool       // no dead-letter exchange on the queue
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	b := &bundle{db: o.db}
	if b.db == nil {
		b.db = dbtest.New(t)
	}
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, b.db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	b.db.Exec(t, `CREATE TABLE IF NOT EXISTS effects (id bigserial PRIMARY KEY, msg_id text NOT NULL, body bytea)`)
	inbox, err := dedupe.New(b.db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b.inbox = inbox
	b.conn = amqptest.Dial(t)
	b.queue = amqptest.Name(t, "q")
	b.dlq = b.queue + ".dlq"
	amqptest.Queue(t, b.conn, b.dlq, nil)
	args := amqp.Table{}
	if !o.noDLX {
		// The default exchange routes by queue name.
		args["x-dead-letter-exchange"] = ""
		args["x-dead-letter-routing-key"] = b.dlq
	}
	if o.quorum {
		args["x-queue-type"] = "quorum"
		if o.deliveryLimit > 0 {
			args["x-delivery-limit"] = int32(o.deliveryLimit)
		}
	}
	amqptest.Queue(t, b.conn, b.queue, args)
	if b.ch, err = b.conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := b.ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return b
}

var msgSeq atomic.Int64

// publish publishes body with a fresh message_id and orderID as business
// key header (orderID "" for none), and waits for the broker's confirm.
func (b *bundle) publish(t *testing.T, orderID, body string) {
	t.Helper()
	h := amqp.Table{}
	if orderID != "" {
		h[orderIDHdr] = orderID
	}
	b.publishMsg(t, amqp.Publishing{
		Headers: h, MessageId: "m-" + strconv.FormatInt(msgSeq.Add(1), 10),
		DeliveryMode: amqp.Persistent, Body: []byte(body),
	})
}

func (b *bundle) publishMsg(t *testing.T, m amqp.Publishing) {
	t.Helper()
	if err := publishConfirmed(b.ch, b.queue, m); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// publishConfirmed publishes m to queue on ch (in confirm mode) and waits
// for the confirm.
func publishConfirmed(ch *amqp.Channel, queue string, m amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err == nil && !ok {
		err = errors.New("nacked")
	}
	return err
}

func (b *bundle) effects(t *testing.T) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM effects")
}

// insertEffect is the test handler's effect: one row per processed message.
func insertEffect(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_id, body) VALUES ($1, $2)",
		dedupe.ClaimFromContext(ctx).Key.ID, d.Body)
	return err
}

// fastConfig is a Config for tests: business key, short delays.
func fastConfig() dedupeamqp.Config {
	return dedupeamqp.Config{
		Key:       dedupeamqp.HeaderKey(orderIDHdr),
		Backoff:   func(int) time.Duration { return 20 * time.Millisecond },
		Reconnect: dedupe.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
	}
}

func newRunner(t *testing.T, b *bundle, url string, cfg dedupeamqp.Config, h dedupe.HandlerFunc[amqp.Delivery]) *dedupeamqp.Runner {
	t.Helper()
	if h == nil {
		h = insertEffect
	}
	if url == "" {
		url = amqptest.URL()
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	r, err := dedupeamqp.New(b.inbox, url, b.queue, cfg, h)
	if err != nil {
		t.Fatalf("new runner: %v", err)
	}
	return r
}

// run runs r until the returned stop is called (or the test ends); stop
// returns Run's error.
func run(t *testing.T, r *dedupeamqp.Runner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var err error
	var stopped bool
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// waitFor polls cond until it holds, failing the test after d without it.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settled waits until the queue holds nothing ready and nothing
// unacknowledged (no consumer holds any of its messages).
func (b *bundle) settled(t *testing.T) {
	t.Helper()
	waitFor(t, 20*time.Second, "the queue to be empty", func() bool {
		return amqptest.Count(t, b.conn, b.queue) == 0
	})
}

// testLogger logs through t.Log, shown only when the test fails (or -v).
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
