package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/natstest"
)

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestEmbeddedServerAndPublish runs the consumer as "nats-consumer
// -embedded" and sends it the same order twice as "nats-consumer -publish"
// does: each publish returns once the durable acknowledged the order, and
// the order ships once.
func TestEmbeddedServerAndPublish(t *testing.T) {
	db := dbtest.New(t)
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{"NATS_URL": "nats://" + freeAddr(t), "DATABASE_URL": db.URL}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	consumer := cfg
	consumer.Embedded = true
	stop := dbtest.Background(t, "nats-consumer -embedded", func(ctx context.Context) error { return run(ctx, consumer) })

	body := []byte(`{"id":"order-1","item":"book","qty":1}`)
	for i := range 2 {
		var out bytes.Buffer
		if err := publishOrder(context.Background(), cfg, body, 30*time.Second, &out); err != nil {
			t.Fatalf("publish %d: %v\n%s", i+1, err, out.String())
		}
		verdict := []string{"new: shipped", "a duplicate: already shipped, not shipped again"}[i]
		if want := fmt.Sprintf("published order-1 to ORDERS as message %d; acknowledged by shipping: %s\n", i+1, verdict); out.String() != want {
			t.Fatalf("publish %d printed %q, want %q", i+1, out.String(), want)
		}
	}
	// Acknowledged means committed: no waiting needed.
	if n := db.Count(t, "SELECT count(*) FROM shipments WHERE order_id = 'order-1'"); n != 1 {
		t.Fatalf("shipments of order-1 = %d, want 1", n)
	}
	if n := db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE scope = 'shipping' AND key = 'order-1' AND state = 'complete'"); n != 1 {
		t.Fatal("order-1 is not complete in the inbox")
	}
	stop()
}

// TestPublishToForeignServer: -publish to a NATS server that no consumer
// uses (another server on the address "nats-consumer -embedded" wanted)
// fails soon with errForeignServer and what to do, instead of waiting out
// its timeout; so it does when the stream is there but nothing pulls from
// the durable.
func TestPublishToForeignServer(t *testing.T) {
	srv := natstest.Server(t)
	db := dbtest.New(t)
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{"NATS_URL": srv.ClientURL(), "DATABASE_URL": db.URL}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"order-1","item":"book","qty":1}`)
	var out bytes.Buffer
	// A timeout that a wait for lack of progress would run into, long
	// before the test's own.
	const timeout = 2 * time.Minute
	err = publishOrder(context.Background(), cfg, body, timeout, &out)
	if !errors.Is(err, errForeignServer) || !strings.Contains(err.Error(), "no stream ORDERS") || !strings.Contains(err.Error(), "NATS_URL") {
		t.Fatalf("publish to a server without the stream = %v, want errForeignServer saying what to do", err)
	}

	// The stream and the durable left by a consumer that is gone.
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.Subjects}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Durable, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = publishOrder(ctx, cfg, body, timeout, &out)
	if !errors.Is(err, errForeignServer) || !strings.Contains(err.Error(), "no consumer pulling from durable shipping") {
		t.Fatalf("publish with nothing pulling = %v, want errForeignServer", err)
	}
}

// TestEmbeddedRefusesBusyAddress: -embedded on an address another server
// holds fails at once and says what to do.
func TestEmbeddedRefusesBusyAddress(t *testing.T) {
	db := dbtest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{"NATS_URL": "nats://" + ln.Addr().String(), "DATABASE_URL": db.URL}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Embedded = true
	err = run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "drop -embedded") {
		t.Fatalf("run = %v, want the busy address and what to do", err)
	}
}

// TestNoServer: without -embedded and with nothing at NATS_URL, the
// consumer stops with an error naming the fix, and -publish gives up after
// its timeout.
func TestNoServer(t *testing.T) {
	db := dbtest.New(t)
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{"NATS_URL": "nats://" + freeAddr(t), "DATABASE_URL": db.URL}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if err := run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "pass -embedded") {
		t.Fatalf("run = %v, want an error that suggests -embedded", err)
	}
	var out bytes.Buffer
	err = publishOrder(context.Background(), cfg, []byte(`{"id":"order-1"}`), 300*time.Millisecond, &out)
	if err == nil || !strings.Contains(err.Error(), "connect to NATS") {
		t.Fatalf("publish = %v", err)
	}
	if err := publishOrder(context.Background(), cfg, []byte(`{"item":"book"}`), time.Second, &out); err == nil || !strings.Contains(err.Error(), `no "id"`) {
		t.Fatalf("publish without an id = %v", err)
	}
}

func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                     "127.0.0.1:4222",
		"nats://localhost":                          "localhost:4222",
		"127.0.0.1:5000":                            "127.0.0.1:5000",
		"nats://user:pw@10.0.0.1:4333,nats://other": "10.0.0.1:4333",
	} {
		if got, err := hostPort(in); err != nil || got != want {
			t.Errorf("hostPort(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := hostPort("nats://"); err == nil {
		t.Error("hostPort(nats://) succeeded")
	}
}
