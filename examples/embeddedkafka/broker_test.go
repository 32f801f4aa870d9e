package embeddedkafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestStart starts a broker on a free port with a seeded topic and reads
// back a record written to it with kafka-go.
func TestStart(t *testing.T) {
	k, err := Start("127.0.0.1:0", 2, "events")
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	addrs := k.Addrs()
	if len(addrs) != 1 || strings.HasSuffix(addrs[0], ":0") {
		t.Fatalf("addrs = %v", addrs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := kafka.DialLeader(ctx, "tcp", addrs[0], "events", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions("events")
	if err != nil || len(parts) != 2 {
		t.Fatalf("partitions = %v, %v; want 2", parts, err)
	}
	if _, err := conn.WriteMessages(kafka.Message{Value: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	m, err := conn.ReadMessage(1 << 20)
	if err != nil || string(m.Value) != "hello" {
		t.Fatalf("read = %q, %v", m.Value, err)
	}
	if _, err := Start("127.0.0.1:0", 0); err == nil {
		t.Fatal("Start with 0 partitions succeeded")
	}
}
