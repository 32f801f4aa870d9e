package test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

const (
	streamName = "ORDERS"
	durable    = "billing"
	orderIDHdr = "Order-Id"
)

// bundle is what setup gives each test: a fresh schema with an effects table,
// an inbox, and a private NATS server with one stream and one durable.
type bundle struct {
	db    *dbtest.DB
	inbox *dedupe.Inbox
	srv   *server.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	cons  jetstream.Consumer
}

type setupOpts struct {
	ackWait time.Duration // Defaults to 2s.
	db      *dbtest.DB    // Defaults to a new schema.
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	if o.ackWait == 0 {
		o.ackWait = 2 * time.Second
	}
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
	b.srv = natstest.Server(t)
	b.nc = natstest.Connect(t, b.srv)
	b.js, err = jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{"orders.>"}}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	b.cons, err = b.js.CreateOrUpdateConsumer(ctx, streamName, jetstream.ConsumerConfig{
		Durable:   durable,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   o.ackWait,
	})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	return b
}

// conn opens another connection to the test's server and its consumer, as a
// second process would.
func (b *bundle) conn(t *testing.T) (*nats.Conn, jetstream.Consumer) {
	t.Helper()
	nc := natstest.Connect(t, b.srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(context.Background(), streamName, durable)
	if err != nil {
		t.Fatal(err)
	}
	return nc, cons
}

// publish publishes body with a fresh Nats-Msg-Id and orderID as business
// key, so that JetStream's duplicate window does not swallow duplicates.
func (b *bundle) publish(t *testing.T, orderID string, body string) {
	t.Helper()
	m := nats.NewMsg("orders.created")
	m.Header.Set(jetstream.MsgIDHeader, nuid.Next())
	m.Header.Set(orderIDHdr, orderID)
	m.Data = []byte(body)
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatalf("publish %s: %v", orderID, err)
	}
}

func (b *bundle) effects(t *testing.T) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM effects")
}

// unacked is what the durable still has to deliver or to see acknowledged.
func (b *bundle) unacked(t *testing.T) int {
	t.Helper()
	ci, err := b.cons.Info(context.Background())
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return ci.NumAckPending + int(ci.NumPending)
}

// insertEffect is the test handler's effect: one row per processed message.
func insertEffect(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_id, body) VALUES ($1, $2)",
		dedupe.ClaimFromContext(ctx).Key.ID, msg.Data())
	return err
}

// fastConfig is a Config for tests: business key, short delays.
func fastConfig() *dedupenats.Config {
	return &dedupenats.Config{
		Key:     dedupenats.HeaderKey(orderIDHdr),
		Backoff: func(int) time.Duration { return 20 * time.Millisecond },
		// Stopping waits for the open pull request; keep it short.
		PullExpiry: 500 * time.Millisecond,
	}
}

// observed returns b with an inbox of its own, over the same schema, whose
// Observer is obs: a runner built on it reports to obs alone.
func (b *bundle) observed(t *testing.T, obs dedupe.Observer) *bundle {
	t.Helper()
	inbox, err := dedupe.New(b.db.Pool, dedupe.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	o := *b
	o.inbox = inbox
	return &o
}

// processed is how many handlings obs saw commit their effects.
func processed(obs *observetest.Observer) int64 { return obs.Handled(dedupe.OutcomeClaimed) }

// duplicates is how many handlings obs saw find their key complete.
func duplicates(obs *observetest.Observer) int64 { return obs.Handled(dedupe.OutcomeDuplicate) }

// consumer creates another durable on the test's stream, for orders.created.
func (b *bundle) consumer(t *testing.T, cc jetstream.ConsumerConfig) jetstream.Consumer {
	t.Helper()
	cc.AckPolicy = jetstream.AckExplicitPolicy
	cc.FilterSubject = "orders.created"
	cons, err := b.js.CreateOrUpdateConsumer(context.Background(), streamName, cc)
	if err != nil {
		t.Fatalf("create consumer %s: %v", cc.Durable, err)
	}
	return cons
}

// info returns the consumer's current info.
func info(t *testing.T, cons jetstream.Consumer) *jetstream.ConsumerInfo {
	t.Helper()
	ci, err := cons.Info(context.Background())
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return ci
}

// unackedOf is what cons still has to deliver or to see acknowledged.
func unackedOf(t *testing.T, cons jetstream.Consumer) int {
	t.Helper()
	ci := info(t, cons)
	return ci.NumAckPending + int(ci.NumPending)
}

// spendDeliveries fetches the next message of cons n times and naks it each
// time, as runners that stopped or lost their database would have: it
// spends n of the message's deliveries without an attempt.
func spendDeliveries(t *testing.T, cons jetstream.Consumer, n int) {
	t.Helper()
	for i := range n {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got int
		for msg := range batch.Messages() {
			got++
			if err := msg.Nak(); err != nil {
				t.Fatal(err)
			}
		}
		if got != 1 {
			t.Fatalf("delivery %d: fetched %d messages (err %v), want 1", i+1, got, batch.Error())
		}
	}
}

func newRunner(t *testing.T, b *bundle, cons jetstream.Consumer, cfg *dedupenats.Config, h dedupe.HandlerFunc[jetstream.Msg]) *dedupenats.Runner {
	t.Helper()
	if h == nil {
		h = insertEffect
	}
	var c dedupenats.Config
	if cfg != nil {
		c = *cfg
	}
	r, err := dedupenats.New(b.inbox, cons, c, h)
	if err != nil {
		t.Fatalf("new runner: %v", err)
	}
	return r
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
