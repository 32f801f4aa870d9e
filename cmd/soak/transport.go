package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// transport is one way of delivering the inputs to a consumer.
type transport struct {
	name string
	// run delivers every input at least once, with faults, until each is
	// acknowledged or ctx ends.
	run func(ctx context.Context, e *env, inputs []string) error
	// proc is the processor of a transport that runs on the soak's broker
	// (runBrokered); the worker subprocess builds it too.
	proc processorFactory
	// child is the worker subprocess of an external transport.
	child func(ctx context.Context, e *env, fl *childFlags, say func(verb, arg string)) error
	// soakedByDefault: part of the default -transports list.
	soakedByDefault bool
	// poison: the transport's handler fails every input designed to fail
	// (f-…), which must then end failed in the inbox or dead-lettered; its
	// inbox has an attempt limit (-max-attempts). Elsewhere such inputs are
	// ordinary and the inbox has no attempt limit.
	poison bool
	// keyless: the transport publishes the k-… inputs without a key, and
	// they must be dead-lettered. Elsewhere they are ordinary inputs.
	keyless bool
}

// transports are the known transports, in the order they are soaked.
var transports = []transport{
	{name: "handle", proc: newHandleProcessor, soakedByDefault: true, poison: true},
	{name: "leased", proc: newLeasedProcessor, soakedByDefault: true, poison: true},
	// starved: leased, with a pool of -starved-conns connections, a slow
	// handler and a short lease.
	{name: "starved", proc: newLeasedProcessor, soakedByDefault: true},
	// poison: Consumer.Handle with a small attempt limit; every input
	// designed to fail arrives -poison-copies times at once.
	{name: "poison", run: runPoison, soakedByDefault: true, poison: true},
	{name: "batch", run: runBatch, soakedByDefault: true},
	{name: "nats", run: runNATS(1), child: natsChild, soakedByDefault: true, poison: true, keyless: true},
	// nats-batch: the JetStream runner in batch mode; not soaked by default
	// (CI time): -transports nats-batch.
	{name: "nats-batch", run: runNATS(50), child: natsChild, poison: true, keyless: true},
	{name: "kafka", run: runKafka(1), child: kafkaChild, soakedByDefault: true, poison: true, keyless: true},
	{name: "kafka-batch", run: runKafka(50), child: kafkaChild, soakedByDefault: true, poison: true, keyless: true},
	{name: "amqp", run: runAMQP, child: amqpChild, soakedByDefault: true, poison: true, keyless: true},
	{name: "redis", run: runRedis, child: redisChild, soakedByDefault: true, poison: true, keyless: true},
	{name: "webhook", run: runWebhook, child: webhookChild, soakedByDefault: true, poison: true},
	{name: "httpidem", run: runHTTPIdem, child: httpidemChild, soakedByDefault: true},
	{name: "outbox", run: runOutbox, child: outboxChild, soakedByDefault: true, poison: true},
	// naive writes its effects without the inbox: the audit must catch it.
	{name: "naive", proc: newNaiveProcessor},
}

func init() {
	for i, t := range transports {
		if t.proc != nil {
			transports[i].run = runBrokered(t.proc)
		}
	}
}

func knownTransports() []string {
	var out []string
	for _, t := range transports {
		out = append(out, t.name)
	}
	return out
}

func defaultTransports() []string {
	return transportsWith(func(t transport) bool { return t.soakedByDefault })
}

// transportsWith names the transports for which pred holds.
func transportsWith(pred func(transport) bool) []string {
	var out []string
	for _, t := range transports {
		if pred(t) {
			out = append(out, t.name)
		}
	}
	return out
}

func lookupTransport(name string) (transport, bool) {
	i := slices.IndexFunc(transports, func(t transport) bool { return t.name == name })
	if i < 0 {
		return transport{}, false
	}
	return transports[i], true
}

// env is what a transport's run gets.
type env struct {
	soak      *soak
	tr        transport
	name      string // the transport's name, recorded with its effects
	scope     string // the inbox scope of its keys
	app       string // application_name of its consumers' connections
	dsn       string // where its consumers connect: the fault proxy, or the database
	faults    *faults
	progress  *progress // paces the faults and detects a stuck run
	inboxless bool      // the naive transport: no inbox rows to audit
	child     bool      // in a worker subprocess

	lease       time.Duration // of its inbox
	maxAttempts int           // of its inbox; -1: no limit
	conns       int32         // brokered transports: connections of the consumers' pool (0: workers+2)

	// Filled by the run, read by the audit.
	inputs       []string        // the deliveries it was given (the poison transport adds copies)
	deadLettered map[string]bool // inputs with a copy in its dead-letter destination
	attempts     *attemptLog     // the poison transport's handler runs
	outcomes     *outcomeLog     // what Consumer.Handle reported, where it is called in this process
}

// newEnv is the environment of transport tr in soak s (in a worker
// subprocess too, whose options carry what it needs).
func newEnv(s *soak, tr transport, app string, f *faults) *env {
	o := s.opts
	e := &env{soak: s, tr: tr, name: tr.name, scope: "soak-" + tr.name, app: app, dsn: o.dsn, faults: f,
		lease: o.lease, maxAttempts: -1, inputs: s.inputs}
	if tr.poison {
		e.maxAttempts = o.maxAttempts
	}
	switch tr.name {
	case "webhook":
		// The receiver scopes its keys by provider and endpoint.
		e.scope = webhook.Scope("standard", webhookEndpoint)
	case "poison":
		e.maxAttempts = o.poisonAttempts
	case "starved":
		e.lease, e.conns = o.starvedLease, int32(o.starvedConns)
	}
	return e
}

// fails reports whether the transport's handler must fail input id: it is
// designed to fail and the transport handles such inputs.
func (e *env) fails(id string) bool { return e.tr.poison && kindOf(id) == kindFails }

// designedToFail reports whether input id must end failed in the inbox or
// dead-lettered rather than committed.
func (e *env) designedToFail(id string) bool {
	return e.fails(id) || (e.tr.keyless && kindOf(id) == kindKeyless)
}

// withoutKey reports whether the transport publishes input id without a key.
func (e *env) withoutKey(id string) bool { return e.tr.keyless && kindOf(id) == kindKeyless }

// countUnique returns how many of the run's unique inputs match.
func (e *env) countUnique(match func(id string) bool) int {
	n := 0
	for id := range e.soak.unique {
		if match(id) {
			n++
		}
	}
	return n
}

// consumerPool connects the transport's consumers (through the fault proxy
// when there is one).
func (e *env) consumerPool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	return e.soak.pool(ctx, e.dsn, e.app, maxConns)
}

// consumerInbox connects the transport's consumers and builds their inbox.
func (e *env) consumerInbox(ctx context.Context, maxConns int32) (*pgxpool.Pool, *dedupe.Inbox, error) {
	pool, err := e.consumerPool(ctx, maxConns)
	if err != nil {
		return nil, nil, err
	}
	inbox, err := dedupe.New(pool, soakConfig(e))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, inbox, nil
}

// countingRedeliveries returns inbox with an Observer that also counts
// every handling of a message delivered before (Delivery > 1) as a broker
// redelivery, for the runners of the real brokers.
func (e *env) countingRedeliveries(inbox *dedupe.Inbox) (*dedupe.Inbox, error) {
	ic := inbox.Config()
	ic.Observer = dedupe.Observers(ic.Observer, observetest.OnHandled(func(h dedupe.HandleInfo, _ dedupe.HandleDone) {
		if h.Message.Delivery > 1 {
			e.faults.add(faultRedeliver)
		}
	}))
	return dedupe.New(inbox.DB(), ic)
}

// processor handles one delivery and says whether to acknowledge it. inTx,
// when not nil, is called inside the effect's transaction (the worker
// subprocess reports it so that the soak can kill it right there).
type processor interface {
	process(ctx context.Context, d delivery, inTx func()) (ack bool)
}

// processorFactory builds a transport's processor over a pool.
type processorFactory func(e *env, pool *pgxpool.Pool, redeliver func(id string)) (processor, error)

// runBrokered runs a transport whose broker is the soak's in-memory broker:
// in-process workers and a worker subprocess that is killed and restarted
// consume from it while a terminator kills their connections.
func runBrokered(newProc processorFactory) func(ctx context.Context, e *env, inputs []string) error {
	return func(ctx context.Context, e *env, inputs []string) error {
		o := e.soak.opts
		conns := e.conns
		if conns == 0 {
			conns = int32(o.workers) + 2
		}
		pool, err := e.consumerPool(ctx, conns)
		if err != nil {
			return err
		}
		defer pool.Close()
		if e.conns > 0 {
			// A starved pool: count the acquires that found it empty.
			defer func() { e.faults.count[faultStarved].Add(pool.Stat().EmptyAcquireCount()) }()
		}
		b := newBroker(inputs, e.faults, o.redelivery, &e.progress.acks)
		proc, err := newProc(e, pool, b.pushUrgent)
		if err != nil {
			return err
		}
		if _, naive := proc.(*naiveProcessor); naive {
			e.inboxless = true
		}

		workers := o.workers
		if e.conns > 0 {
			workers *= 4 // a starved pool: many more consumers than connections
		}
		return consumeBroker(ctx, e, b, workers, 1, true, func(ctx context.Context, ds []delivery) []bool {
			return []bool{proc.process(ctx, ds[0], nil)}
		})
	}
}

// consumeBroker consumes b until every delivery was acknowledged or ctx
// ends: workers goroutines each take up to batch deliveries at a time and
// settle each as process says (true: ack), while the terminator kills their
// connections and, with subprocess (and -kills), a worker subprocess that is
// killed and restarted consumes too.
func consumeBroker(ctx context.Context, e *env, b *broker, workers, batch int, subprocess bool,
	process func(ctx context.Context, ds []delivery) (acks []bool)) error {
	o := e.soak.opts
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				first, ok := b.next(wctx)
				if !ok {
					return
				}
				ds := []delivery{first}
				for len(ds) < batch {
					d, ok := b.tryNext()
					if !ok {
						break
					}
					ds = append(ds, d)
				}
				for i, ack := range process(wctx, ds) {
					if ack {
						b.ack(ds[i])
					} else {
						b.nack(ds[i])
					}
				}
			}
		})
	}
	var supErr error
	if subprocess && o.kills > 0 {
		wg.Go(func() {
			supErr = supervise(wctx, func(kills *int) (bool, error) { return runWorker(wctx, e, b, kills) })
		})
	}
	wg.Go(func() { terminator(wctx, e, o.terminate) })

	err := b.wait(ctx)
	stop()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("%d deliveries not acknowledged: %w", b.left(), err)
	}
	return supErr
}

// errUnexpected marks outcomes that must not happen in a soak.
var errUnexpected = errors.New("soak: unexpected outcome")

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
