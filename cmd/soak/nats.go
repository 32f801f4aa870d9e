package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/natstest"
)

// The soak's JetStream names.
const (
	natsStream  = "SOAK"
	natsSubject = "soak.orders"
	natsDurable = "soak"
	natsIDHdr   = "Order-Id"
	// The dead-letter stream of the nats transport.
	natsDLQStream  = "SOAKDLQ"
	natsDLQSubject = "soak.dlq"
	// natsAckWait is short so that the messages a killed worker held are
	// redelivered soon.
	natsAckWait = 2 * time.Second
)

// runNATS soaks the JetStream runner: an in-process nats-server, every
// input published with a fresh Nats-Msg-Id (so JetStream keeps the
// duplicates) and its id in the Order-Id header (the keyless inputs
// without it, so the runner copies them to its dead-letter subject), two
// in-process runners on one durable consumer (one of them stopped and
// restarted at random) and a worker subprocess on the same durable that is
// killed mid-transaction. At the end it reads the dead-letter stream. With
// batch > 1 every runner is in batch mode (Config.BatchSize), the nats-batch
// transport.
func runNATS(batch int) func(ctx context.Context, e *env, inputs []string) error {
	return func(ctx context.Context, e *env, inputs []string) error { return soakNATS(ctx, e, inputs, batch) }
}

func soakNATS(ctx context.Context, e *env, inputs []string, batch int) error {
	embedded, err := natstest.Embed()
	if err != nil {
		return err
	}
	defer embedded.Close()
	js := embedded.JS
	cons, err := createDurable(ctx, js, natsStream, natsSubject, natsDurable)
	if err != nil {
		return err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsDLQStream, Subjects: []string{natsDLQSubject}}); err != nil {
		return fmt.Errorf("create dead-letter stream: %w", err)
	}
	defer func() {
		// Read the dead letters even after a failed run, for the audit.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		dl, err := natsDeadLetters(rctx, js)
		if err != nil {
			e.soak.log.Error("soak: read the NATS dead letters", "err", err)
		}
		e.deadLettered = dl
	}()
	o := e.soak.opts
	pool, inbox, err := e.consumerInbox(ctx, int32(o.workers)*2+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	handler := faultyHandler[jetstream.Msg](e, nil)
	return runExternal(ctx, e, external{
		consumers: 2,
		consume: func(ctx context.Context, _ int) error {
			return runNATSRunner(ctx, e, inbox, cons, handler, o.workers, batch, js)
		},
		childArgs: []string{"-nats-url", embedded.URL(), "-nats-batch", strconv.Itoa(batch)},
		feed: func(ctx context.Context) error {
			for i, id := range inputs {
				m := nats.NewMsg(natsSubject)
				m.Header.Set(jetstream.MsgIDHeader, "p-"+strconv.Itoa(i))
				if !e.withoutKey(id) {
					m.Header.Set(natsIDHdr, id)
				}
				m.Data = []byte(id)
				if _, err := js.PublishMsgAsync(m); err != nil {
					return fmt.Errorf("publish: %w", err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
				return nil
			case <-ctx.Done():
				return nil
			}
		},
		done: func(ctx context.Context) (bool, error) {
			ci, err := cons.Info(ctx)
			if err != nil {
				return false, err
			}
			if ci.NumPending+uint64(ci.NumAckPending) > 0 || ci.Delivered.Stream < uint64(len(inputs)) {
				return false, nil
			}
			return e.settledInDB(ctx)
		},
	})
}

// createDurable creates a stream over subject and its durable consumer, with
// a short AckWait and no redelivery limit.
func createDurable(ctx context.Context, js jetstream.JetStream, stream, subject, durable string) (jetstream.Consumer, error) {
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		return nil, fmt.Errorf("create stream: %w", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: natsAckWait, MaxDeliver: -1,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	return cons, nil
}

// runNATSRunner runs one in-process dedupenats.Runner on cons until ctx
// ends, counting every handling of a delivery after the first as a broker
// redelivery (after a nak, a stopped runner, or a killed worker's expired
// AckWait), as its inbox's Observer is told.
// With dlq it dead-letters to the nats transport's dead-letter subject.
func runNATSRunner(ctx context.Context, e *env, inbox *dedupe.Inbox, cons jetstream.Consumer, h dedupe.HandlerFunc[jetstream.Msg],
	workers, batch int, dlq jetstream.JetStream) error {
	cfg := natsConfig(e.scope, workers, batch, dlq)
	inbox, err := e.countingRedeliveries(inbox)
	if err != nil {
		return err
	}
	r, err := dedupenats.New(inbox, cons, cfg, h)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// connectJS connects a worker subprocess to the soak's nats-server.
func connectJS(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// natsConfig is the runners' configuration: the business key from the
// Order-Id header, short delays, batch messages per transaction, and with
// dlq the dead-letter subject.
func natsConfig(scope string, workers, batch int, dlq jetstream.JetStream) dedupenats.Config {
	cfg := dedupenats.Config{
		Scope:         scope,
		Key:           dedupenats.HeaderKey(natsIDHdr),
		Workers:       workers,
		BatchSize:     batch,
		Backoff:       func(int) time.Duration { return 20 * time.Millisecond },
		InFlightDelay: 50 * time.Millisecond,
		Heartbeat:     natsAckWait / 4,
		DrainTimeout:  2 * time.Second,
	}
	if dlq != nil {
		cfg.DeadLetterSubject, cfg.DeadLetterJS = natsDLQSubject, dlq
	}
	return cfg
}

// natsDeadLetters returns the inputs with a copy in the dead-letter stream
// (the copy's data is the input's id).
func natsDeadLetters(ctx context.Context, js jetstream.JetStream) (map[string]bool, error) {
	st, err := js.Stream(ctx, natsDLQStream)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	if info.State.Msgs == 0 {
		return out, nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			return out, err
		}
		out[string(m.Data)] = true
	}
	return out, nil
}

// natsChild is the NATS worker subprocess: one runner on the soak's durable.
func natsChild(ctx context.Context, e *env, fl *childFlags, say func(verb, arg string)) error {
	nc, js, err := connectJS(fl.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	cons, err := js.Consumer(ctx, natsStream, natsDurable)
	if err != nil {
		return err
	}
	pool, inbox, err := e.consumerInbox(ctx, 3)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := dedupenats.New(inbox, cons, natsConfig(e.scope, 2, fl.natsBatch, js), childHandler[jetstream.Msg](e, say))
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// childFlags are the transport flags of a worker subprocess.
type childFlags struct {
	natsURL      string
	natsBatch    int
	kafkaBrokers string
	kafkaBatch   int
	webhookAddr  string
	amqpURL      string
	amqpQueue    string
	redisURL     string
	redisStream  string
}

func (c *childFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.natsURL, "nats-url", "", "NATS server of the nats transport")
	fs.IntVar(&c.natsBatch, "nats-batch", 1, "batch size of the nats transport")
	fs.StringVar(&c.kafkaBrokers, "kafka-brokers", "", "Kafka brokers of the kafka transport")
	fs.IntVar(&c.kafkaBatch, "kafka-batch", 1, "batch size of the kafka transport")
	fs.StringVar(&c.webhookAddr, "webhook-addr", "127.0.0.1:0", "listen address of the webhook transport")
	fs.StringVar(&c.amqpURL, "amqp-url", "", "RabbitMQ broker of the amqp transport")
	fs.StringVar(&c.amqpQueue, "amqp-queue", "", "queue of the amqp transport")
	fs.StringVar(&c.redisURL, "redis-url", "", "Redis of the redis transport")
	fs.StringVar(&c.redisStream, "redis-stream", "", "stream of the redis transport")
}
