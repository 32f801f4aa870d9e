package main

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// wire counts round trips to PostgreSQL: pgconn writes each flush of
// queued messages (a statement, a pipelined batch, BEGIN, COMMIT, a
// prepare) with one Write on the connection's socket and then waits for
// the reply, so writes to the pool's sockets are its round trips. Counting
// at the socket sees every one of them, including those a query tracer does
// not (prepares, pings).
type wire struct {
	writes atomic.Int64
}

// dialFunc dials as pgconn does by default and counts the writes of the
// connection.
func (w *wire) dialFunc(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: &w.writes}, nil
	}
}

// countingConn is a net.Conn that counts its writes.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
