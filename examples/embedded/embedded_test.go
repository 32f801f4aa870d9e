package embedded

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestNATS starts a server on a free port and stores a message in a
// JetStream stream; Close removes the store.
func TestNATS(t *testing.T) {
	s, err := NATS("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "s.x", []byte("hello"))
	if err != nil || ack.Sequence != 1 {
		t.Fatalf("publish = %+v, %v", ack, err)
	}
}

// TestNATSBusyAddress: an address another listener holds is refused with
// the reason, at once.
func TestNATSBusyAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if s, err := NATS(ln.Addr().String()); err == nil || !strings.Contains(err.Error(), "address already in use") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("NATS on a busy address = %v", err)
	}
	if _, err := NATS("no-port"); err == nil {
		t.Fatal("NATS(no-port) succeeded")
	}
}
