package dedupeotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
	"github.com/exactlyonce/dedupe/otel/internal/oteltest"
	"github.com/exactlyonce/dedupe/outbox"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// Shorthands for the recorder's helpers.
var (
	attr      = oteltest.Attr
	wantAttrs = oteltest.WantAttrs
	linked    = oteltest.Linked
)

// env is one test's database, with an inbox and an outbox reporting to tel.
type env struct {
	*oteltest.Tel
	db     *dbtest.DB
	inbox  *dedupe.Inbox
	outbox *outbox.Outbox
}

func setup(t testing.TB, cfg *dedupe.Config) *env {
	t.Helper()
	e := &env{Tel: oteltest.New(t, &dedupeotel.Config{OutboxSystem: "test"}), db: dbtest.New(t)}
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, e.db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	e.db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_key text NOT NULL)`)
	var c dedupe.Config
	if cfg != nil {
		c = *cfg
	}
	c.Observer = e.Obs
	c.Logger = dbtest.Logger(t)
	var err error
	if e.inbox, err = dedupe.New(e.db.Pool, c); err != nil {
		t.Fatal(err)
	}
	if e.outbox, err = outbox.New(e.db.Pool, outbox.Config{Schema: c.Schema, Clock: c.Clock, Logger: c.Logger, Observer: e.Obs}); err != nil {
		t.Fatal(err)
	}
	return e
}

// delivery is a message as a transport hands it over.
type delivery struct {
	ID       string // the dedup key
	Delivery int
	Headers  map[string][]string
	Fail     bool // the handler fails on the first attempt
}

// describe is the ConsumerConfig.Describe of deliveries.
func describe(d delivery) dedupe.MessageInfo {
	var h dedupe.Headers
	if d.Headers != nil {
		h = dedupe.MapHeaders(d.Headers)
	}
	return dedupe.MessageInfo{System: "test", Destination: "orders.created", ID: fmt.Sprintf("%s/%d", d.ID, d.Delivery),
		Group: "billing", Partition: -1, Offset: -1, Delivery: d.Delivery, Headers: h}
}

// insertEffect writes the message's effect, and fails the first attempt of
// a message marked Fail.
func insertEffect(ctx context.Context, tx pgx.Tx, d delivery) error {
	if d.Fail && dedupe.ClaimFromContext(ctx).Attempt == 1 {
		return errors.New("first attempt fails")
	}
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", d.ID)
	return err
}

func (e *env) consumer(t testing.TB, h dedupe.HandlerFunc[delivery]) *dedupe.Consumer[delivery] {
	t.Helper()
	if h == nil {
		h = insertEffect
	}
	c, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[delivery]{
		Scope: "billing", Key: func(d delivery) (string, error) { return d.ID, nil }, Describe: describe,
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
