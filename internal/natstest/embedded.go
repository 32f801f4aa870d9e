package natstest

import (
	"os"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Embedded is an in-process NATS server with JetStream, storing in its own
// temporary directory, and one client connection to it: what the soak and
// the bench run against (the examples use the public examples/embedded).
type Embedded struct {
	Server *server.Server
	Conn   *nats.Conn
	JS     jetstream.JetStream
	dir    string
}

// Embed starts an Embedded server; Close stops it and removes its store.
func Embed() (*Embedded, error) {
	dir, err := os.MkdirTemp("", "dedupe-nats-")
	if err != nil {
		return nil, err
	}
	e := &Embedded{dir: dir}
	if e.Server, err = Start(dir); err != nil {
		e.Close()
		return nil, err
	}
	if e.Conn, err = nats.Connect(e.Server.ClientURL()); err != nil {
		e.Close()
		return nil, err
	}
	if e.JS, err = jetstream.New(e.Conn); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// URL is the server's client URL.
func (e *Embedded) URL() string { return e.Server.ClientURL() }

// Close closes the connection, shuts the server down and removes its store.
func (e *Embedded) Close() {
	if e.Conn != nil {
		e.Conn.Close()
	}
	if e.Server != nil {
		e.Server.Shutdown()
		e.Server.WaitForShutdown()
	}
	_ = os.RemoveAll(e.dir)
}
