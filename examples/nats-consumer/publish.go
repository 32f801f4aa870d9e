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

	"github.com/exactlyonce/dedupe/examples/embedded"
	"github.com/exactlyonce/dedupe/examples/shipping"
)

// publishSubject is where -publish sends orders; the default NATS_SUBJECTS
// (orders.>) captures it.
const publishSubject = "orders.created"

// publishPoll is how often publishOrder looks for the server, the stream and
// the acknowledgement.
const publishPoll = 50 * time.Millisecond

// foreignGrace is how long publishOrder waits for the stream or the durable
// on a server that is not an embedded one of the examples: a consumer
// creates both as soon as it has connected, so a server that has had
// neither for this long is not the one a consumer uses (say, another NATS
// server already on 4222, which kept "nats-consumer -embedded" from
// starting). On the example's own embedded server it waits up to -timeout.
const foreignGrace = 3 * time.Second

// errForeignServer: the NATS server publishOrder reached has no stream or
// durable for it, and is not the embedded server of nats-consumer.
var errForeignServer = errors.New("no nats-consumer uses this NATS server")

// publishOrder publishes one order to the stream, its id in the KEY_HEADER
// header, and waits until the durable's acknowledgement floor passes it: a
// consumer committed its shipment (or found it a duplicate) and acked. It
// waits for the server and the stream too, which a consumer started just
// before creates, all within timeout; on a server other than the examples'
// embedded one it waits for the stream and the durable foreignGrace at
// most. It says whether the order was new or a duplicate, from its key's
// state in the consumer's inbox (DATABASE_URL) before and after.
func publishOrder(ctx context.Context, cfg config, body []byte, timeout time.Duration, out io.Writer) error {
	var o shipping.Order
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
	// Not the examples' embedded server: what is missing now is not about
	// to appear, unless a consumer is connecting this very moment.
	foreign := nc.ConnectedServerName() != embedded.ServerName
	found := time.Now()
	notThere := func(what string) error {
		if foreign && time.Since(found) > foreignGrace {
			return fmt.Errorf("%w: the NATS server at %s (named %q, not nats-consumer's -embedded one) has no %s, which a consumer creates when it starts; "+
				"if another server holds that address, stop it or set NATS_URL to a free address for both nats-consumer -embedded and -publish",
				errForeignServer, nc.ConnectedUrlRedacted(), nc.ConnectedServerName(), what)
		}
		return nil
	}
	if err := poll(ctx, func() (bool, error) {
		_, err := js.Stream(ctx, cfg.Stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return false, notThere("stream " + cfg.Stream)
		}
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("stream %s (a consumer creates it when it starts): %w", cfg.Stream, err)
	}
	scope := cfg.Durable // the runner's scope is its durable's name
	before, beforeErr := keyState(ctx, cfg.DatabaseURL, scope, o.ID)

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
				return false, notThere("durable " + cfg.Durable)
			} else if err != nil {
				return false, err
			}
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false, err
		}
		if info.AckFloor.Stream >= ack.Sequence {
			return true, nil
		}
		if info.NumWaiting == 0 && info.NumAckPending == 0 {
			return false, notThere("consumer pulling from durable " + cfg.Durable)
		}
		return false, nil
	}); err != nil {
		fmt.Fprintln(out, "not acknowledged")
		return fmt.Errorf("waiting for durable %s to acknowledge message %d (is a consumer running?): %w", cfg.Durable, ack.Sequence, err)
	}
	after, afterErr := keyState(ctx, cfg.DatabaseURL, scope, o.ID)
	fmt.Fprintf(out, "acknowledged by %s: %s\n", cfg.Durable, verdict(before, after, beforeErr, afterErr))
	return nil
}

// errNoID is the error for an order without an id, if it has none.
func errNoID(o shipping.Order) error {
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
