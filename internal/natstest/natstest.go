// Package natstest runs a real NATS server with JetStream in-process for
// tests, with its store in a temporary directory.
package natstest

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Server starts a NATS server with JetStream on a random loopback port and
// shuts it down when the test ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Start starts a NATS server with JetStream storing in dir, for programs
// (the examples) that are not tests. The caller shuts it down.
func Start(dir string) (*server.Server, error) {
	s, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		return nil, err
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errNotReady
	}
	return s, nil
}

// errNotReady is returned when the server does not start accepting
// connections in time.
var errNotReady = errors.New("natstest: server not ready after 10s")

// Connect connects to s and closes the connection when the test ends.
func Connect(t testing.TB, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}
