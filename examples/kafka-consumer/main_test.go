package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/kafkatest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// The example runs against an in-process Kafka-protocol broker and a fresh
// schema: 500 payment events, a fifth of them producer retries under the
// same Idempotency-Key, one malformed. Every payment is booked once, the
// malformed event is dead-lettered, and every offset is committed.
func TestConsumerBooksEachPaymentOnce(t *testing.T) {
	db := dbtest.New(t, dbtest.Options{MaxConns: 2})
	brokers := kafkatest.ClusterWith(t, 3, []string{"payments", "payments.dlq"},
		[]kfake.Opt{kfake.GroupMinSessionTimeout(100 * time.Millisecond)})

	cfg, err := configFromEnv(func(name string) string {
		return map[string]string{
			"KAFKA_BROKERS":   strings.Join(brokers, ","),
			"DATABASE_URL":    db.URL,
			"KAFKA_DLQ_TOPIC": "payments.dlq",
			"BATCH_SIZE":      "50",
		}[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.fastGroup = true
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))

	rng := rand.New(rand.NewPCG(9, 9))
	var msgs []kafka.Message
	var want int64
	unique := 0
	for n := 0; len(msgs) < 500; {
		id := fmt.Sprintf("pay-%d", n)
		if n > 0 && rng.Float64() < 0.2 {
			id = fmt.Sprintf("pay-%d", rng.IntN(n)) // a producer retry
		} else {
			n++
			unique++
			want += int64(100 * n)
		}
		var amount int64
		fmt.Sscanf(id, "pay-%d", &amount)
		body := fmt.Sprintf(`{"payment_id":%q,"account":"acct-%d","amount_cents":%d}`, id, amount%7, 100*(amount+1))
		msgs = append(msgs, kafka.Message{Key: []byte(id), Value: []byte(body),
			Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(id)}}})
	}
	msgs = append(msgs[:250:250], append([]kafka.Message{{Key: []byte("junk"), Value: []byte("{not json"),
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte("junk-1")}}}}, msgs[250:]...)...)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "payments", Balancer: &kafka.Hash{},
		BatchSize: len(msgs), BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll, Transport: &kafka.Transport{}}
	defer w.Transport.(*kafka.Transport).CloseIdleConnections()
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	stop := dbtest.Background(t, "kafka-consumer", func(ctx context.Context) error { return run(ctx, cfg) })
	deadline := time.Now().Add(40 * time.Second)
	for {
		var n int
		err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&n)
		if err == nil && n >= unique {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger has %d entries after 40s, want %d (err %v)", n, unique, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The malformed event reaches the dead-letter topic.
	dr := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "dlq-check", Topic: "payments.dlq",
		StartOffset: kafka.FirstOffset, MaxWait: 500 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout: 1500 * time.Millisecond, RebalanceTimeout: 1500 * time.Millisecond})
	dm, err := dr.FetchMessage(ctx)
	_ = dr.Close()
	if err != nil {
		t.Fatalf("read dead letter: %v", err)
	}
	if string(dm.Value) != "{not json" {
		t.Fatalf("dead letter = %q", dm.Value)
	}

	stop()
	// Every offset is committed: a restart would not fetch anything again.
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: w.Transport}
	offsets, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: cfg.Group, Topics: map[string][]int{cfg.Topic: {0, 1, 2}}})
	if err != nil {
		t.Fatalf("fetch the group's offsets: %v", err)
	}
	var committed int64
	for _, p := range offsets.Topics[cfg.Topic] {
		if p.Error != nil {
			t.Fatalf("offset of partition %d: %v", p.Partition, p.Error)
		}
		committed += max(p.CommittedOffset, 0)
	}
	if committed != int64(len(msgs)) {
		t.Fatalf("committed offsets add up to %d, want all %d events", committed, len(msgs))
	}
	var n, distinct int
	var sum int64
	if err := db.Pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT payment_id), sum(amount_cents) FROM ledger").Scan(&n, &distinct, &sum); err != nil {
		t.Fatal(err)
	}
	if n != unique || distinct != unique {
		t.Fatalf("ledger entries = %d (%d distinct), want %d", n, distinct, unique)
	}
	if sum != want {
		t.Fatalf("ledger sum = %d, want %d", sum, want)
	}
	if f := db.Pool.QueryRow(ctx, "SELECT count(*) FROM dedupe_inbox WHERE key = 'junk-1' AND state = 'failed'").Scan(&n); f != nil || n != 1 {
		t.Fatalf("junk-1 not marked failed (%v)", f)
	}
}

func TestConfigFromEnv(t *testing.T) {
	c, err := configFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Brokers, ",") != "127.0.0.1:9092" || c.Topic != "payments" || c.Group != "ledger" || c.BatchSize != 100 || c.DLQTopic != "" {
		t.Fatalf("defaults = %+v", c)
	}
	for name, env := range map[string]map[string]string{
		"bad batch":        {"BATCH_SIZE": "0"},
		"bad purge":        {"PURGE_EVERY": "soon"},
		"dlq is the topic": {"KAFKA_DLQ_TOPIC": "payments"},
	} {
		if _, err := configFromEnv(func(k string) string { return env[k] }); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
