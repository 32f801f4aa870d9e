package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/internal/dbtest"
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

// TestEmbeddedBrokerAndPublish runs the consumer as "kafka-consumer
// -embedded" and sends it the same payment twice as "kafka-consumer
// -publish" does: each publish returns once the group committed past it,
// and the payment is booked once.
func TestEmbeddedBrokerAndPublish(t *testing.T) {
	db := dbtest.New(t, dbtest.Options{MaxConns: 2})
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{"KAFKA_BROKERS": freeAddr(t), "DATABASE_URL": db.URL}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	consumer := cfg
	consumer.Embedded = true
	stop := dbtest.Background(t, "kafka-consumer -embedded", func(ctx context.Context) error { return run(ctx, consumer) })

	body := []byte(`{"payment_id":"pay-1","account":"acct-7","amount_cents":1900}`)
	for i := range 2 {
		var out bytes.Buffer
		if err := publishPayment(context.Background(), cfg, body, 40*time.Second, &out); err != nil {
			t.Fatalf("publish %d: %v\n%s", i+1, err, out.String())
		}
		if want := fmt.Sprintf("at offset %d; committed by ledger\n", i); !strings.HasPrefix(out.String(), "published pay-1 to payments/") ||
			!strings.HasSuffix(out.String(), want) {
			t.Fatalf("publish %d printed %q, want ... %q", i+1, out.String(), want)
		}
	}
	// Committed past it means booked: no waiting needed.
	if n := db.Count(t, "SELECT count(*) FROM ledger WHERE payment_id = 'pay-1'"); n != 1 {
		t.Fatalf("ledger entries of pay-1 = %d, want 1", n)
	}
	stop()
}

// TestMissingBroker: without -embedded and with no broker at KAFKA_BROKERS,
// the consumer stops at once with an error naming the fix, instead of
// retrying forever in silence.
func TestMissingBroker(t *testing.T) {
	db := dbtest.New(t, dbtest.Options{MaxConns: 2})
	addr := freeAddr(t)
	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{"KAFKA_BROKERS": addr, "DATABASE_URL": db.URL}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	err = run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "no Kafka broker answers at "+addr) || !strings.Contains(err.Error(), "pass -embedded") {
		t.Fatalf("run = %v, want an error that names the address and suggests -embedded", err)
	}
	var out bytes.Buffer
	if err := publishPayment(context.Background(), cfg, []byte(`{"payment_id":"pay-1"}`), 300*time.Millisecond, &out); err == nil ||
		!strings.Contains(err.Error(), "no broker with topic payments") {
		t.Fatalf("publish = %v", err)
	}
}
