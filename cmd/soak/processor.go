package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// soakConfig is the inbox configuration of every transport: no attempt limit
// (random faults must never poison a key; the run's timeout bounds it
// instead), and the leased transport's short lease.
func soakConfig(e *env) *dedupe.Config {
	return &dedupe.Config{MaxAttempts: -1, Lease: e.soak.opts.lease, Logger: e.soak.libLog()}
}

// effect writes the one effect of message id inside tx.
func effect(ctx context.Context, tx pgx.Tx, transport, id string) error {
	_, err := tx.Exec(ctx, sqlInsertEffect, transport, id)
	return err
}

// handleProcessor runs each delivery through dedupe.Consumer.Handle, with a
// handler that writes the effect and then, at random, fails or panics.
type handleProcessor struct {
	consumer *dedupe.Consumer[delivery]
	log      *slog.Logger
}

func newHandleProcessor(e *env, pool *pgxpool.Pool, _ func(string)) (processor, error) {
	inbox, err := dedupe.New(pool, soakConfig(e))
	if err != nil {
		return nil, err
	}
	p := &handleProcessor{log: e.soak.log}
	p.consumer, err = dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[delivery]{
		Scope: e.scope,
		Key:   func(d delivery) (string, error) { return d.id, nil },
	}, func(ctx context.Context, tx pgx.Tx, d delivery) error {
		if err := effect(ctx, tx, e.name, d.id); err != nil {
			return err
		}
		if hook := inTxFrom(ctx); hook != nil {
			hook()
		}
		switch {
		case e.faults.hit(faultError):
			return errInjected
		case e.faults.hit(faultPanic):
			panic("soak: injected panic for " + d.id)
		}
		return nil
	})
	return p, err
}

func (p *handleProcessor) process(ctx context.Context, d delivery, inTx func()) bool {
	if inTx != nil {
		ctx = withInTx(ctx, inTx)
	}
	outcome, err := p.consumer.Handle(ctx, d)
	switch {
	case err == nil:
		return true // claimed now, or a duplicate of a committed claim
	case outcome == dedupe.OutcomePoisoned || outcome == dedupe.OutcomeConflict:
		// Impossible with no attempt limit and no fingerprints; the audit
		// reports the key as missing.
		p.log.Error("soak: unexpected outcome", "key", d.id, "outcome", outcome, "err", err)
		return true
	default:
		return false // retry, in flight, or a killed connection: redeliver
	}
}

type inTxKey struct{}

func withInTx(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, inTxKey{}, f)
}

func inTxFrom(ctx context.Context) func() {
	f, _ := ctx.Value(inTxKey{}).(func())
	return f
}

// leasedProcessor claims each delivery in leased mode (Inbox.Begin) and
// writes the effect and the completion in one transaction (CompleteTx), so
// that a holder whose lease was taken over cannot commit its effect. Faults:
// a holder that dies after its claim (the lease must expire before the
// redelivery takes over), one that outlives its lease and completes late
// (while the broker redelivers), and handler errors (Fail).
type leasedProcessor struct {
	inbox     *dedupe.Inbox
	e         *env
	redeliver func(id string)
}

func newLeasedProcessor(e *env, pool *pgxpool.Pool, redeliver func(string)) (processor, error) {
	inbox, err := dedupe.New(pool, soakConfig(e))
	if err != nil {
		return nil, err
	}
	return &leasedProcessor{inbox: inbox, e: e, redeliver: redeliver}, nil
}

func (p *leasedProcessor) process(ctx context.Context, d delivery, inTx func()) bool {
	log := p.e.soak.log
	c, err := p.inbox.Begin(ctx, dedupe.Key{Scope: p.e.scope, ID: d.id})
	if err != nil {
		return false
	}
	switch c.Outcome {
	case dedupe.OutcomeDuplicate:
		return true
	case dedupe.OutcomeInFlight:
		return false // a live lease (perhaps of a dead holder): redeliver later
	case dedupe.OutcomeClaimed:
	default:
		log.Error("soak: unexpected outcome", "key", d.id, "outcome", c.Outcome)
		return true
	}
	if p.e.faults.hit(faultAbandon) {
		return false // died holding the lease: nothing completes or fails it
	}
	late := p.e.faults.hit(faultLate)
	if late && p.redeliver != nil {
		p.redeliver(d.id) // the broker gives up waiting for the slow holder
	}
	err = pgx.BeginFunc(ctx, p.inbox.DB(), func(tx pgx.Tx) error {
		if err := effect(ctx, tx, p.e.name, d.id); err != nil {
			return err
		}
		if inTx != nil {
			inTx()
		}
		if late {
			sleepCtx(ctx, p.inbox.Config().Lease+p.inbox.Config().Lease/2)
		}
		if p.e.faults.hit(faultError) {
			return errInjected
		}
		return p.inbox.CompleteTx(ctx, tx, c, dedupe.Result{Status: 200})
	})
	switch {
	case err == nil:
		return true
	case errors.Is(err, dedupe.ErrLeaseLost):
		// Taken over after the lease ran out: the effect rolled back; the
		// new holder's completion counts. Redeliver to see it complete.
		return false
	case errors.Is(err, errInjected):
		if _, ferr := p.inbox.Fail(context.WithoutCancel(ctx), c, err); ferr != nil && !errors.Is(ferr, dedupe.ErrLeaseLost) {
			log.Debug("soak: fail", "key", d.id, "err", ferr)
		}
		return false
	default:
		return false // killed connection or shutdown; the lease will expire
	}
}

// naiveProcessor writes the effect without any claim, as a consumer without
// dedupe would: the audit must report its duplicates.
type naiveProcessor struct {
	e    *env
	pool *pgxpool.Pool
}

func newNaiveProcessor(e *env, pool *pgxpool.Pool, _ func(string)) (processor, error) {
	return &naiveProcessor{e: e, pool: pool}, nil
}

func (p *naiveProcessor) process(ctx context.Context, d delivery, inTx func()) bool {
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := effect(ctx, tx, p.e.name, d.id); err != nil {
			return err
		}
		if inTx != nil {
			inTx()
		}
		if p.e.faults.hit(faultError) {
			return errInjected
		}
		return nil
	})
	return err == nil
}

// faultyHandler is the handler of the external transports: it writes the
// effect of the claimed key, calls observe, and then fails or panics at
// random.
func faultyHandler[M any](e *env, observe func(M)) dedupe.HandlerFunc[M] {
	return func(ctx context.Context, tx pgx.Tx, msg M) error {
		if observe != nil {
			observe(msg)
		}
		if err := effect(ctx, tx, e.name, dedupe.ClaimFromContext(ctx).Key.ID); err != nil {
			return err
		}
		switch {
		case e.faults.hit(faultError):
			return errInjected
		case e.faults.hit(faultPanic):
			panic("soak: injected panic")
		}
		return nil
	}
}

// childHandler is the handler of an external transport's worker subprocess:
// it writes the claimed key's effect, then reports "tx" and lingers, the
// window in which the soak kills it.
func childHandler[M any](e *env, say func(verb, arg string)) dedupe.HandlerFunc[M] {
	return func(ctx context.Context, tx pgx.Tx, _ M) error {
		id := dedupe.ClaimFromContext(ctx).Key.ID
		if err := effect(ctx, tx, e.name, id); err != nil {
			return err
		}
		say("tx", id)
		time.Sleep(inTxPause)
		return nil
	}
}
