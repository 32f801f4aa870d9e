package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// idHeader carries the business key of the transports' messages.
const idHeader = "Order-Id"

// latencies collects op latencies from many goroutines.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, d)
	l.mu.Unlock()
}

// drained is the result of draining a fixed number of messages.
func drained(name, baseline, unit string, workers, msgs int, elapsed time.Duration, lat *latencies) *result {
	r := &result{scenario: name, baseline: baseline, unit: unit, workers: workers, msgs: int64(msgs), elapsed: elapsed}
	if lat != nil {
		l := lat.all
		slices.Sort(l)
		r.p50, r.p99 = percentile(l, 0.5), percentile(l, 0.99)
	}
	return r
}

// waitEffects polls until the effects table holds n rows. More than n is an
// error: every message of a row has its own key, so an extra effect is a
// duplicate, and a row that made one measures nothing worth printing.
func (b *bench) waitEffects(ctx context.Context, n int) error {
	for {
		var got int
		if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM bench_effects").Scan(&got); err != nil {
			return err
		}
		if got > n {
			return fmt.Errorf("%d effects for %d messages: duplicated effects", got, n)
		}
		if got == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d effects: %w", got, n, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// runTransports measures the NATS JetStream runner, the Kafka runner
// (runKafka, with -rounds) and the outbox relay against hand-written
// equivalents, draining -transport-msgs pre-published messages per row.
func (rep *report) runTransports(ctx context.Context, b *bench, _ string, log io.Writer) error {
	o := rep.opts
	tctx, cancel := context.WithTimeout(ctx, o.transportTimeout)
	defer cancel()
	embedded, err := natstest.Embed()
	if err != nil {
		return err
	}
	defer embedded.Close()
	js := embedded.JS
	row := 0
	for _, w := range o.workers {
		type run struct {
			name, baseline string
			f              func(ctx context.Context, js jetstream.JetStream, row, w int) (*result, error)
		}
		for _, rn := range []run{
			{"hand-written JetStream consumer", "", b.natsHand},
			{"dedupenats.Runner", "hand-written JetStream consumer", b.natsRunner},
		} {
			if !o.selected(rn.name) {
				continue
			}
			row++
			if err := b.reset(tctx, fmt.Sprintf("t%d", row)); err != nil {
				return err
			}
			if _, err := b.pool.Exec(tctx, sqlResetOutbox); err != nil {
				return err
			}
			r, err := rn.f(tctx, js, row, w)
			if err != nil {
				return fmt.Errorf("%s, %d workers: %w", rn.name, w, err)
			}
			r.scenario, r.baseline = rn.name, rn.baseline
			rep.transports = append(rep.transports, r)
			fmt.Fprintf(log, "bench: %-40s workers=%-3d %9.0f msg/s p50=%v p99=%v\n", r.scenario, w, r.throughput(), r.p50, r.p99)
		}
	}
	fillRatios(rep.transports)
	// The relay and Kafka rows honour -rounds (see runRelays, runKafka).
	if err := rep.runRelays(tctx, b, js, log); err != nil {
		return err
	}
	return rep.runKafka(tctx, b, log)
}

// natsStream creates a stream and durable consumer for one row and
// publishes the row's messages, each with a unique Order-Id.
func (b *bench) natsStream(ctx context.Context, js jetstream.JetStream, row int) (jetstream.Consumer, func(), error) {
	name := "BENCH" + strconv.Itoa(row)
	subject := "bench." + strconv.Itoa(row)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = js.DeleteStream(context.WithoutCancel(ctx), name) }
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 10000,
	})
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	for i := range b.opts.transportMsgs {
		m := nats.NewMsg(subject)
		id := b.run + "-" + strconv.Itoa(i)
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set(idHeader, id)
		m.Data = []byte(body)
		if _, err := js.PublishMsgAsync(m); err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		cleanup()
		return nil, nil, ctx.Err()
	}
	return cons, cleanup, nil
}

// natsHand is the hand-written JetStream consumer: one pull iterator feeding
// w workers, each running claim + effect in a transaction, committing, then
// DoubleAck. Latency: the transaction.
func (b *bench) natsHand(ctx context.Context, js jetstream.JetStream, row, w int) (*result, error) {
	cons, cleanup, err := b.natsStream(ctx, js, row)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	n := b.opts.transportMsgs
	start := time.Now()
	it, err := cons.Messages(jetstream.PullMaxMessages(max(2*w, 64)))
	if err != nil {
		return nil, err
	}
	msgs := make(chan jetstream.Msg)
	var lat latencies
	var wg sync.WaitGroup
	errc := make(chan error, w)
	wg.Go(func() {
		defer close(msgs)
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			msgs <- m
		}
	})
	for range w {
		wg.Go(func() {
			for m := range msgs {
				t0 := time.Now()
				if err := b.handClaimEffectTx(ctx, "nats-hand", m.Headers().Get(idHeader)); err != nil {
					errc <- err
					_ = m.Nak()
					continue
				}
				lat.add(time.Since(t0))
				_ = m.DoubleAck(ctx)
			}
		})
	}
	err = b.waitEffects(ctx, n)
	elapsed := time.Since(start)
	it.Stop()
	wg.Wait()
	select {
	case e := <-errc:
		err = errors.Join(err, e)
	default:
	}
	if err != nil {
		return nil, err
	}
	return drained("", "", "tx", w, n, elapsed, &lat), nil
}

// natsRunner drains the same messages with dedupenats.Runner; latency: each
// committed handling's duration (claim, handler, commit), as its inbox's
// Observer is told.
func (b *bench) natsRunner(ctx context.Context, js jetstream.JetStream, row, w int) (*result, error) {
	cons, cleanup, err := b.natsStream(ctx, js, row)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	n := b.opts.transportMsgs
	var lat latencies
	ic := b.inbox.Config()
	ic.Observer = observetest.OnHandled(func(_ dedupe.HandleInfo, d dedupe.HandleDone) {
		if d.Outcome == dedupe.OutcomeClaimed {
			lat.add(d.Duration)
		}
	})
	inbox, err := dedupe.New(b.pool, ic)
	if err != nil {
		return nil, err
	}
	r, err := dedupenats.New(inbox, cons, dedupenats.Config{
		Scope:   "nats-runner",
		Key:     dedupenats.HeaderKey(idHeader),
		Workers: w,
	}, func(ctx context.Context, tx pgx.Tx, _ jetstream.Msg) error {
		_, err := tx.Exec(ctx, sqlEffect, dedupe.ClaimFromContext(ctx).Key.ID, body)
		return err
	})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	err = b.waitEffects(ctx, n)
	elapsed := time.Since(start)
	stop()
	if rerr := <-done; err == nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	return drained("", "", "tx", w, n, elapsed, &lat), nil
}
