package main

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// The broker rows (JetStream, Kafka, RabbitMQ, Redis Streams) share their
// frame: each side of a row empties the run's effects, publishes its
// backlog, then drains it with a consumer while the window measures, stops
// the consumer and checks that no effect was written twice. The library's
// side is one of the runners over an inbox whose Observer counts the
// window (window.observed); the hand-written side is a loop of its own
// feeding workers that run handConsume.

// runner is what the library's broker runners have in common.
type runner interface {
	Run(ctx context.Context) error
}

// drainRow measures win while a consumer drains the backlog: start starts
// the consumer on goroutines of its own, running until the context it is
// given ends, and returns wait, which waits for them and returns the
// consumer's error. After the window the consumer is stopped and waited
// for, and the run's effects are checked.
func (b *bench) drainRow(ctx context.Context, win *window, start func(ctx context.Context) (wait func() error, err error)) (*sample, error) {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	wait, err := start(rctx)
	if err != nil {
		return nil, err
	}
	s, err := win.measure(ctx, b.meter, b.opts.warmup)
	stop()
	if werr := wait(); err == nil {
		err = werr
	}
	if err != nil {
		return nil, err
	}
	return s, b.checkEffects(ctx)
}

// runnerRow is the library's side of a broker row, once its backlog is
// published: newRunner builds the runner over an inbox that counts the
// window, whose handler writes each claimed message's effect (effect). The
// runner runs until the window is measured; its context's end is not an
// error. Latency: the handling, from the claim's BEGIN to a successful
// COMMIT, timed by the inbox's Observer.
func (b *bench) runnerRow(ctx context.Context, sp span, newRunner func(inbox *dedupe.Inbox) (runner, error)) (*sample, error) {
	win := newWindow(sp)
	inbox, err := dedupe.New(b.pool, win.observed(b.inbox.Config()))
	if err != nil {
		return nil, err
	}
	r, err := newRunner(inbox)
	if err != nil {
		return nil, err
	}
	return b.drainRow(ctx, win, func(rctx context.Context) (func() error, error) {
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return func() error {
			if err := <-done; !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		}, nil
	})
}

// effect is the runners' handler: the claimed message's effect, in the
// claim's transaction.
func effect[M any](ctx context.Context, tx pgx.Tx, _ M) error {
	_, err := tx.Exec(ctx, sqlEffect, dedupe.ClaimFromContext(ctx).Key.ID, body)
	return err
}

// handConsume is a worker of a hand-written consumer: for each message of
// msgs, until it closes or ctx ends, it runs the hand-written claim +
// effect transaction for the message's id, counts the message in win once
// committed (as the runners' are counted), then acks it. A failed
// transaction is reported to win, unless ctx ended, and the message nacked
// (nack nil: left to the broker's redelivery). An ack's error is reported
// likewise. Latency: the transaction.
func handConsume[M any](ctx context.Context, b *bench, win *window, msgs <-chan M, id func(M) string, ack func(M) error, nack func(M)) {
	for {
		var m M
		select {
		case <-ctx.Done():
			return
		case next, ok := <-msgs:
			if !ok {
				return
			}
			m = next
		}
		t0 := time.Now()
		if _, err := b.handClaimEffectTx(ctx, benchScope, id(m)); err != nil {
			if ctx.Err() == nil {
				win.fail(err)
			}
			if nack != nil {
				nack(m)
			}
			continue
		}
		win.lat.add(time.Since(t0))
		win.add(1) // committed, counted as the runners' are
		if err := ack(m); err != nil && ctx.Err() == nil {
			win.fail(err)
		}
	}
}
