package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishSubject is where -publish sends orders; the default NATS_SUBJECTS
// (orders.>) captures it.
const publishSubject = "orders.created"

// publishPoll is how often publishOrder looks for the server, the stream and
// the acknowledgement.
const publishPoll = 50 * time.Millisecond

// publishOrder publishes one order to the stream, its id in the KEY_HEADER
// header, and waits until the durable's acknowledgement floor passes it: a
// consumer committed its shipment (or found it a duplicate) and acked. It
// waits for the server and the stream too, which a consumer started just
// before creates, all within timeout.
func publishOrder(ctx context.Context, cfg config, body []byte, timeout time.Duration, out io.Writer) error {
	var o order
	if err := json.Unmarshal(body, &o); err != nil || o.ID == "" {
		return fmt.Errorf("-publish wants an order such as {\"id\":\"order-1\",\"item\":\"book\",\"qty\":1}: %v", errors.Join(err, errNoID(o)))
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	nc, err := connectWhenUp(ctx, cfg.NATSURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := poll(ctx, func() (bool, error) {
		_, err := js.Stream(ctx, cfg.Stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("stream %s (a consumer creates it when it starts): %w", cfg.Stream, err)
	}

	m := nats.NewMsg(publishSubject)
	m.Data = body
	header := cfg.KeyHeader
	if header == "" {
		header = jetstream.MsgIDHeader
	}
	m.Header.Set(header, o.ID)
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	fmt.Fprintf(out, "published %s to %s as message %d; ", o.ID, ack.Stream, ack.Sequence)

	var cons jetstream.Consumer
	if err := poll(ctx, func() (bool, error) {
		var err error
		if cons == nil {
			if cons, err = js.Consumer(ctx, cfg.Stream, cfg.Durable); errors.Is(err, jetstream.ErrConsumerNotFound) {
				return false, nil
			} else if err != nil {
				return false, err
			}
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.AckFloor.Stream >= ack.Sequence, nil
	}); err != nil {
		fmt.Fprintln(out, "not acknowledged")
		return fmt.Errorf("waiting for durable %s to acknowledge message %d (is a consumer running?): %w", cfg.Durable, ack.Sequence, err)
	}
	fmt.Fprintf(out, "acknowledged by %s\n", cfg.Durable)
	return nil
}

// errNoID is the error for an order without an id, if it has none.
func errNoID(o order) error {
	if o.ID == "" {
		return errors.New(`no "id"`)
	}
	return nil
}

// connectWhenUp connects to the server at natsURL, retrying while nothing
// listens there yet, until ctx ends.
func connectWhenUp(ctx context.Context, natsURL string) (*nats.Conn, error) {
	var nc *nats.Conn
	err := poll(ctx, func() (bool, error) {
		var err error
		nc, err = nats.Connect(natsURL, nats.Name("dedupe-nats-consumer-publish"))
		if errors.Is(err, nats.ErrNoServers) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", natsURL, err)
	}
	return nc, nil
}

// poll calls done every publishPoll until it reports true or fails, or ctx
// ends.
func poll(ctx context.Context, done func() (bool, error)) error {
	t := time.NewTicker(publishPoll)
	defer t.Stop()
	for {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// hostPort returns the host:port of the first server of a NATS URL list
// such as nats://127.0.0.1:4222, for the embedded server to listen on.
func hostPort(natsURL string) (string, error) {
	first, _, _ := strings.Cut(natsURL, ",")
	if !strings.Contains(first, "://") {
		first = "nats://" + first
	}
	u, err := url.Parse(first)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("NATS_URL=%q: want a URL such as nats://127.0.0.1:4222", natsURL)
	}
	port := u.Port()
	if port == "" {
		port = "4222"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}
