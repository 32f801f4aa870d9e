package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe/internal/amqptest"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestTwoCopiesShipEachOrderOnce runs two copies of the program against the
// broker and one database, publishes every order twice (under new
// message_ids, with an Order-Id business key), an undecodable message and
// one without the key header, and counts shipments and dead letters.
func TestTwoCopiesShipEachOrderOnce(t *testing.T) {
	db := dbtest.New(t)
	conn := amqptest.Dial(t)
	queue := amqptest.Name(t, "orders")
	t.Cleanup(func() {
		amqptest.Delete(queue, "")
		amqptest.Delete(queue+".dlq", queue+".dlx")
	})
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{
			"AMQP_URL": amqptest.URL(), "DATABASE_URL": db.URL, "AMQP_QUEUE": queue,
			"WORKERS": "2", "PURGE_EVERY": "50ms",
		}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)

	ready := make(chan error, 2)
	var stops []func()
	for range 2 {
		c := cfg
		var once sync.Once
		c.ready = func() { once.Do(func() { ready <- nil }) }
		stops = append(stops, dbtest.Background(t, "rabbitmq-consumer", func(ctx context.Context) error {
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
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	publish := func(h amqp.Table, id string, body []byte) {
		if err := ch.PublishWithContext(context.Background(), "", queue, true, false, amqp.Publishing{Headers: h, MessageId: id, Body: body}); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	const orders = 25
	for copy := range 2 {
		for n := range orders {
			publish(amqp.Table{"Order-Id": fmt.Sprintf("order-%d", n)}, fmt.Sprintf("m-%d-%d", n, copy),
				fmt.Appendf(nil, `{"id":"order-%d","item":"book","qty":%d}`, n, 1+copy))
		}
	}
	publish(amqp.Table{"Order-Id": "garbage"}, "g", []byte("{not json"))
	publish(nil, "k", []byte(`{"id":"order-x","item":"book","qty":1}`)) // no key header

	dbtest.WaitFor(t, 30*time.Second, "two dead letters and every order shipped", func() bool {
		return amqptest.Count(t, conn, queue+".dlq") == 2 && db.Count(t, "SELECT count(DISTINCT order_id) FROM shipments") == orders
	})
	for _, stop := range stops {
		stop() // fails the test if the copy does not stop, or stops with an error
	}
	if n := amqptest.Count(t, conn, queue); n != 0 {
		t.Fatalf("%d messages left in the queue, want 0", n)
	}
	if n := db.Count(t, "SELECT count(*) FROM shipments"); n != orders {
		t.Fatalf("shipments = %d, want %d", n, orders)
	}
	if n := db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'garbage' AND state = 'failed'"); n != 1 {
		t.Fatalf("the undecodable message was not recorded as failed")
	}
}

// TestPublishOrder publishes with -publish's function, twice, and a
// consumer ships the order once.
func TestPublishOrder(t *testing.T) {
	db := dbtest.New(t)
	conn := amqptest.Dial(t)
	queue := amqptest.Name(t, "orders")
	t.Cleanup(func() {
		amqptest.Delete(queue, "")
		amqptest.Delete(queue+".dlq", queue+".dlx")
	})
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{"DATABASE_URL": db.URL, "AMQP_URL": amqptest.URL(), "AMQP_QUEUE": queue, "KEY_HEADER": "-"}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	ctx := context.Background()
	var out bytes.Buffer
	for range 2 {
		if err := publishOrder(ctx, cfg, []byte(`{"id":"order-1","item":"book","qty":1}`), &out); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(out.String(), "published order-1 to "+queue) {
		t.Fatalf("output %q", out.String())
	}
	if err := publishOrder(ctx, cfg, []byte(`nope`), &out); err == nil {
		t.Fatal("publishing a non-order: no error")
	}
	stop := dbtest.Background(t, "rabbitmq-consumer", func(ctx context.Context) error { return run(ctx, cfg) })
	dbtest.WaitFor(t, 20*time.Second, "both copies consumed", func() bool {
		return amqptest.Count(t, conn, queue) == 0 && db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'order-1' AND state = 'complete'") == 1
	})
	stop()
	if n := db.Count(t, "SELECT count(*) FROM shipments WHERE order_id = 'order-1'"); n != 1 {
		t.Fatalf("shipments of order-1 = %d, want 1", n)
	}
}

func TestConfigFromEnv(t *testing.T) {
	c, err := configFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if c.AMQPURL != "amqp://guest:guest@127.0.0.1:5672/" || c.Queue != "orders" || c.Workers != 4 ||
		c.PurgeEvery != time.Hour || c.KeyHeader != "Order-Id" || !strings.Contains(c.DatabaseURL, "127.0.0.1:5432") {
		t.Fatalf("defaults = %+v", c)
	}
	if c, err := configFromEnv(func(n string) string { return map[string]string{"KEY_HEADER": "-"}[n] }); err != nil || c.KeyHeader != "" {
		t.Fatalf(`KEY_HEADER "-" = %q, %v; want "" (the message_id property)`, c.KeyHeader, err)
	}
	for _, bad := range []map[string]string{{"WORKERS": "0"}, {"WORKERS": "x"}, {"PURGE_EVERY": "soon"}} {
		if _, err := configFromEnv(func(n string) string { return bad[n] }); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
