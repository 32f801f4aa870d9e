package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/natstest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestTwoCopiesShipEachOrderOnce runs two copies of the program against one
// NATS server and one database, publishes every order twice (under new
// Nats-Msg-Ids, with an Order-Id business key) plus an undecodable message,
// and counts shipments.
func TestTwoCopiesShipEachOrderOnce(t *testing.T) {
	db := dbtest.New(t)
	srv := natstest.Server(t)
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{
			"NATS_URL": srv.ClientURL(), "DATABASE_URL": db.URL, "KEY_HEADER": "Order-Id",
			"WORKERS": "2", "PURGE_EVERY": "50ms",
		}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)

	// Two copies; each reports on ready once its runner starts, or with the
	// error it stopped on before that.
	ready := make(chan error, 2)
	var stops []func()
	for range 2 {
		c := cfg
		var once sync.Once
		c.ready = func() { once.Do(func() { ready <- nil }) }
		stops = append(stops, dbtest.Background(t, "nats-consumer", func(ctx context.Context) error {
			err := run(ctx, c)
			once.Do(func() { ready <- fmt.Errorf("stopped before it started: %v", err) })
			return err
		}))
	}
	for i := range 2 {
		select {
		case err := <-ready:
			if err != nil {
				t.Fatalf("a copy failed to start: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("timed out waiting for copy %d of 2 to start", i+1)
		}
	}
	ctx := context.Background()

	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const orders = 25
	publish := func(orderID string, body []byte) {
		m := nats.NewMsg("orders.created")
		m.Header.Set(jetstream.MsgIDHeader, nuid.Next())
		m.Header.Set("Order-Id", orderID)
		m.Data = body
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	for copy := range 2 {
		for n := range orders {
			publish(fmt.Sprintf("order-%d", n), fmt.Appendf(nil, `{"id":"order-%d","item":"book","qty":%d}`, n, 1+copy))
		}
	}
	publish("garbage", []byte("{not json"))
	// A message without the Order-Id header has no key: dead-lettered.
	if _, err := js.Publish(ctx, "orders.created", []byte(`{"id":"order-x"}`)); err != nil {
		t.Fatal(err)
	}

	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %d pending, %d unacked", ci.NumPending, ci.NumAckPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, stop := range stops {
		stop() // fails the test if the copy does not stop, or stops with an error
	}
	if n := db.Count(t, "SELECT count(*) FROM shipments"); n != orders {
		t.Fatalf("shipments = %d, want %d", n, orders)
	}
	if n := db.Count(t, "SELECT count(DISTINCT order_id) FROM shipments"); n != orders {
		t.Fatalf("distinct shipments = %d, want %d", n, orders)
	}
	if n := db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'garbage' AND state = 'failed'"); n != 1 {
		t.Fatalf("the undecodable message was not recorded as failed")
	}
	dlq, err := js.Stream(ctx, cfg.Stream+"_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	si, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if si.State.Msgs != 1 {
		t.Fatalf("dead-letter stream holds %d messages, want 1 (the keyless one)", si.State.Msgs)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Config.MaxDeliver != -1 {
		t.Fatalf("MaxDeliver = %d, want -1", ci.Config.MaxDeliver)
	}
}

func TestConfigFromEnv(t *testing.T) {
	c, err := configFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if c.NATSURL != "nats://127.0.0.1:4222" || c.Stream != "ORDERS" || c.Durable != "shipping" || c.Workers != 4 ||
		c.PurgeEvery != time.Hour || c.DeadLetter != "dlq.ORDERS" || c.KeyHeader != "Order-Id" {
		t.Fatalf("defaults = %+v", c)
	}
	if c, err := configFromEnv(func(n string) string { return map[string]string{"KEY_HEADER": "-"}[n] }); err != nil || c.KeyHeader != "" {
		t.Fatalf(`KEY_HEADER "-" = %q, %v; want "" (the adapter's default key)`, c.KeyHeader, err)
	}
	for _, bad := range []map[string]string{{"WORKERS": "0"}, {"WORKERS": "x"}, {"PURGE_EVERY": "soon"}} {
		if _, err := configFromEnv(func(n string) string { return bad[n] }); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
