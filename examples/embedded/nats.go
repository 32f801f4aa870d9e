package embedded

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ServerName is the name of the servers NATS starts, as clients see it
// (nats.Conn.ConnectedServerName): a program can tell the example's own
// server from another one listening on the same address.
const ServerName = "dedupe-examples-embedded"

// NATSServer is a NATS server with JetStream running in this process.
type NATSServer struct {
	srv *server.Server
	dir string
}

// natsReadyTimeout bounds how long NATS waits for the server to accept
// connections.
const natsReadyTimeout = 10 * time.Second

// NATS starts a NATS server with JetStream listening on addr ("host:port";
// port 0 picks a free one), storing its streams in a new temporary
// directory. Close stops it and removes the directory.
func NATS(addr string) (*NATSServer, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("embedded NATS: address %q: invalid port", addr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else if err := checkFree(addr); err != nil {
		// nats-server reports a busy port only in its log; say it here.
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	dir, err := os.MkdirTemp("", "dedupe-nats-")
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: ServerName,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv.Start()
	s := &NATSServer{srv: srv, dir: dir}
	if !srv.ReadyForConnections(natsReadyTimeout) {
		s.Close()
		return nil, errNATSNotReady
	}
	return s, nil
}

// errNATSNotReady: the server did not accept connections in time.
var errNATSNotReady = errors.New("embedded NATS: the server did not accept connections within 10s")

// URL is the server's client URL, such as nats://127.0.0.1:4222.
func (s *NATSServer) URL() string { return s.srv.ClientURL() }

// Close shuts the server down and removes its store.
func (s *NATSServer) Close() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	_ = os.RemoveAll(s.dir)
}

// checkFree reports an error when addr cannot be listened on, such as when
// another server holds the port.
func checkFree(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return ln.Close()
}
