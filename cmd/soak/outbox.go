package main

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/natstest"
)

const (
	outboxStream  = "SOAKOUT"
	outboxSubject = "soak.outbox"
	outboxDurable = "soak-outbox"
)

// runOutbox soaks the transactional outbox end to end: every input is
// enqueued in a producer transaction (a repeated input is a second outbox
// message carrying the same Order-Id, as when a client sent its order
// twice); two in-process relays (one stopped and restarted at random) and a
// relay subprocess killed right after a publish, before it recorded it,
// publish to JetStream; a runner consumes with the inbox keyed on Order-Id
// and writes the effects, failing and panicking at random.
func runOutbox(ctx context.Context, e *env, inputs []string) error {
	embedded, err := natstest.Embed()
	if err != nil {
		return err
	}
	defer embedded.Close()
	js := embedded.JS
	cons, err := createDurable(ctx, js, outboxStream, outboxSubject, outboxDurable)
	if err != nil {
		return err
	}
	o := e.soak.opts
	pool, inbox, err := e.consumerInbox(ctx, int32(o.workers)+6)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := dedupe.NewOutbox(pool, dedupe.OutboxConfig{Logger: e.soak.libLog()})
	if err != nil {
		return err
	}
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{})
	if err != nil {
		return err
	}
	handler := faultyHandler[jetstream.Msg](e, nil)
	return runExternal(ctx, e, external{
		consumers: 3, // 0 and 1: relays (0 is restarted at random); 2: the runner
		consume: func(ctx context.Context, n int) error {
			if n < 2 {
				return runRelay(ctx, e, ob, pub)
			}
			return runNATSRunner(ctx, e, inbox, cons, handler, o.workers, nil)
		},
		childArgs: []string{"-nats-url", embedded.URL()},
		feed: func(ctx context.Context) error {
			for from := 0; from < len(inputs); from += 200 {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for i := from; i < min(from+200, len(inputs)); i++ {
						if _, err := ob.Enqueue(ctx, tx, dedupe.Message{
							ID: "p-" + strconv.Itoa(i), Topic: outboxSubject, Payload: []byte(inputs[i]),
							Headers: map[string][]string{natsIDHdr: {inputs[i]}},
						}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					// A terminated connection: enqueue this batch again.
					from -= 200
					sleepCtx(ctx, 10*time.Millisecond)
				}
			}
			return nil
		},
		done: func(ctx context.Context) (bool, error) {
			st, err := ob.Stats(ctx)
			if err != nil || st.Pending+st.Parked > 0 {
				return false, err
			}
			ci, err := cons.Info(ctx)
			if err != nil || ci.NumPending+uint64(ci.NumAckPending) > 0 {
				return false, err
			}
			return e.settledInDB(ctx)
		},
	})
}

func runRelay(ctx context.Context, e *env, ob *dedupe.Outbox, pub dedupe.Publisher) error {
	relay, err := dedupe.NewRelay(ob, pub, dedupe.RelayConfig{
		BatchSize: 10, PollInterval: 50 * time.Millisecond, MaxAttempts: -1,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second, Logger: e.soak.libLog(),
	})
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

// killablePublisher reports "tx" after each publish, while the relay's
// claim transaction is still open and the batch not yet recorded.
type killablePublisher struct {
	dedupe.Publisher
	say func(verb, arg string)
}

func (p killablePublisher) Publish(ctx context.Context, msgs []*dedupe.OutboxMessage) []error {
	errs := p.Publisher.Publish(ctx, msgs)
	if len(msgs) > 0 {
		p.say("tx", msgs[0].ID)
		time.Sleep(inTxPause)
	}
	return errs
}

// outboxChild is the relay subprocess of the outbox transport.
func outboxChild(ctx context.Context, e *env, fl *childFlags, say func(verb, arg string)) error {
	nc, js, err := connectJS(fl.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	pool, err := e.consumerPool(ctx, 3)
	if err != nil {
		return err
	}
	defer pool.Close()
	return relayOver(ctx, e, pool, js, say)
}

func relayOver(ctx context.Context, e *env, pool *pgxpool.Pool, js jetstream.JetStream, say func(verb, arg string)) error {
	ob, err := dedupe.NewOutbox(pool, dedupe.OutboxConfig{Logger: e.soak.libLog()})
	if err != nil {
		return err
	}
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{})
	if err != nil {
		return err
	}
	return runRelay(ctx, e, ob, killablePublisher{Publisher: pub, say: say})
}
