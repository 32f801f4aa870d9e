package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/outbox"
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
	ob, err := outbox.New(pool, outbox.Config{Logger: e.soak.libLog()})
	if err != nil {
		return err
	}
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{})
	if err != nil {
		return err
	}
	handler := faultyHandler[jetstream.Msg](e, nil)
	size := outboxFeedSize(o)
	var enqueued, failedTx atomic.Int64
	err = runExternal(ctx, e, external{
		consumers: 3, // 0 and 1: relays (0 is restarted at random); 2: the runner
		consume: func(ctx context.Context, n int) error {
			if n < 2 {
				return runRelay(ctx, e, ob, pub)
			}
			return runNATSRunner(ctx, e, inbox, cons, handler, o.workers, 1, nil)
		},
		childArgs: []string{"-nats-url", embedded.URL()},
		feed: func(ctx context.Context) error {
			for from := 0; from < len(inputs); {
				to := min(from+size, len(inputs))
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for i := from; i < to; i++ {
						if _, err := ob.Enqueue(ctx, tx, outbox.Message{
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
					// A fault of the proxy or a terminated connection:
					// enqueue these inputs again (after a lost COMMIT reply
					// they are in the outbox already, and their IDs write
					// nothing).
					failedTx.Add(1)
					sleepCtx(ctx, 10*time.Millisecond)
					continue
				}
				from = to
				enqueued.Store(int64(to))
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
	if err != nil && enqueued.Load() < int64(len(inputs)) {
		// Say where the feed was, so that a run that stopped before every
		// input was enqueued is not taken for a stuck relay or runner.
		err = fmt.Errorf("%w (the feed enqueued %d of %d inputs; %d producer transactions failed)",
			err, enqueued.Load(), len(inputs), failedTx.Load())
	}
	return err
}

// outboxFeedMax is the most inputs one producer transaction of the outbox
// transport enqueues.
const outboxFeedMax = 200

// outboxFeedSize is how many inputs one producer transaction of the outbox
// transport enqueues: at most outboxFeedMax, and few enough that it commits
// at least half the time through the fault proxy. BEGIN and every Enqueue
// are statements the proxy may cut or drop the reply to, and a single fault
// fails the whole transaction, which the feed then enqueues again: at the
// tests' rates (1% of each per statement, 5% lost COMMIT replies) a
// transaction of 200 committed about once in 60 tries, and .ci/stress saw
// the feed retry its second 200 inputs for longer than -idle, the first 200
// all done (effects stuck at their 139).
func outboxFeedSize(o *options) int {
	if !proxied(o) {
		return outboxFeedMax
	}
	cut, lost, commitLost := o.rates[faultCut], o.rates[faultReplyLost], o.rates[faultCommitLost]
	stmt := (1 - cut) * (1 - lost)         // BEGIN or an Enqueue gets through
	commit := (1 - cut) * (1 - commitLost) // and so does the COMMIT's reply
	if stmt >= 1 {
		return outboxFeedMax
	}
	// The largest n with stmt^(n+1) * commit >= 1/2.
	n := int(math.Log(0.5/commit)/math.Log(stmt)) - 1
	return max(1, min(n, outboxFeedMax))
}

func runRelay(ctx context.Context, e *env, ob *outbox.Outbox, pub outbox.Publisher) error {
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{
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
	outbox.Publisher
	say func(verb, arg string)
}

func (p killablePublisher) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
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
	ob, err := outbox.New(pool, outbox.Config{Logger: e.soak.libLog()})
	if err != nil {
		return err
	}
	pub, err := dedupenats.NewOutboxPublisher(js, dedupenats.OutboxPublisherConfig{})
	if err != nil {
		return err
	}
	return runRelay(ctx, e, ob, killablePublisher{Publisher: pub, say: say})
}
