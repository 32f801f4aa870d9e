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

// soakConfig is the inbox configuration of every transport: its lease, and
// its attempt limit: none where no input is designed to fail (random faults
// must never poison a key), else one that random faults do not exhaust
// (-max-attempts), or the poison transport's small one.
func soakConfig(e *env) dedupe.Config {
	return dedupe.Config{MaxAttempts: e.maxAttempts, Lease: e.lease, Logger: e.soak.libLog()}
}

// effect writes the one effect of message id inside tx, with the attempt
// number in ctx if any (outcomeLog).
func effect(ctx context.Context, tx pgx.Tx, transport, id string) error {
	_, err := tx.Exec(ctx, sqlInsertAttemptEffect, transport, id, attemptOf(ctx))
	return err
}

// handleProcessor runs each delivery through dedupe.Consumer.Handle, with a
// handler that writes the effect and then, at random, fails or panics.
type handleProcessor struct {
	consumer *dedupe.Consumer[delivery]
	log      *slog.Logger
	outcomes *outcomeLog
}

func newHandleProcessor(e *env, pool *pgxpool.Pool, _ func(string)) (processor, error) {
	inbox, err := dedupe.New(pool, soakConfig(e))
	if err != nil {
		return nil, err
	}
	p := &handleProcessor{log: e.soak.log}
	if !e.child {
		p.outcomes = newOutcomeLog()
		e.outcomes = p.outcomes
	}
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
		case e.fails(d.id):
			return errInjected
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
	outcome, err := p.outcomes.handle(ctx, p.consumer, d)
	return settled(p.log, d.id, outcome, err)
}

// settled says whether a delivery that Consumer.Handle (or a leased
// processor) handled with outcome and err is acknowledged: processed now or
// before, or its key failed (for an input designed to fail the expected end;
// for any other the audit reports it). Anything else is redelivered: a
// failed attempt, a key in flight, a killed connection, an outcome unknown.
func settled(log *slog.Logger, id string, outcome dedupe.Outcome, err error) bool {
	switch {
	case err == nil:
		return true
	case outcome == dedupe.OutcomePoisoned:
		if kindOf(id) != kindFails {
			log.Error("soak: an input not designed to fail was marked failed", "key", id, "err", err)
		}
		return true
	case outcome == dedupe.OutcomeConflict:
		// Impossible without fingerprints; the audit reports the input
		// missing.
		log.Error("soak: unexpected outcome", "key", id, "outcome", outcome, "err", err)
		return true
	default:
		return false
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
	slow      time.Duration // how long the handler holds its transaction
}

func newLeasedProcessor(e *env, pool *pgxpool.Pool, redeliver func(string)) (processor, error) {
	inbox, err := dedupe.New(pool, soakConfig(e))
	if err != nil {
		return nil, err
	}
	p := &leasedProcessor{inbox: inbox, e: e, redeliver: redeliver}
	if e.conns > 0 {
		p.slow = e.soak.opts.slow
	}
	return p, nil
}

func (p *leasedProcessor) process(ctx context.Context, d delivery, inTx func()) bool {
	log := p.e.soak.log
	c, err := p.inbox.Begin(ctx, dedupe.Key{Scope: p.e.scope, ID: d.id})
	if err != nil {
		return false
	}
	switch c.Outcome {
	case dedupe.OutcomeClaimed:
	case dedupe.OutcomeInFlight:
		return false // a live lease (perhaps of a dead holder): redeliver later
	default:
		return settled(log, d.id, c.Outcome, c.Outcome.Err())
	}
	if p.e.faults.hit(faultAbandon) {
		return false // died holding the lease: nothing completes or fails it
	}
	if p.redeliver != nil && p.e.faults.hit(faultLate) {
		// The holder stalls after its claim (a pause, a starved pool) and
		// outlives its lease; the broker, tired of waiting, delivers the
		// message again at once and the next consumer takes the key over.
		// This holder's effect and completion must then be refused.
		lease := p.inbox.Config().Lease
		sleepCtx(ctx, lease+lease/4)
		p.redeliver(d.id)
		p.awaitTakeover(ctx, c)
	}
	err = pgx.BeginFunc(ctx, p.inbox.DB().(*pgxpool.Pool), func(tx pgx.Tx) error {
		if err := effect(ctx, tx, p.e.name, d.id); err != nil {
			return err
		}
		if inTx != nil {
			inTx()
		}
		if p.slow > 0 {
			sleepCtx(ctx, p.slow) // the starved transport's slow handler
		}
		if p.e.fails(d.id) || p.e.faults.hit(faultError) {
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
		p.e.faults.add(faultFenced)
		return false
	case errors.Is(err, errInjected):
		poisoned, ferr := p.inbox.Fail(context.WithoutCancel(ctx), c, err)
		if ferr != nil && !errors.Is(ferr, dedupe.ErrLeaseLost) {
			log.Debug("soak: fail", "key", d.id, "err", ferr)
		}
		if poisoned {
			return settled(log, d.id, dedupe.OutcomePoisoned, err)
		}
		return false
	default:
		return false // killed connection or shutdown; the lease will expire
	}
}

// awaitTakeover waits until another holder took c's key over (or completed
// it), for at most ten leases: a late holder then completes too late for
// sure. It polls on the soak's own connections, which the fault proxy and a
// starved pool leave alone.
func (p *leasedProcessor) awaitTakeover(ctx context.Context, c *dedupe.Claim) {
	lease := p.inbox.Config().Lease
	for range 100 {
		var token int64
		err := p.e.soak.admin.QueryRow(ctx, sqlToken, p.e.scope, c.Key.ID).Scan(&token)
		if err != nil && ctx.Err() != nil {
			return
		}
		if err == nil && token != c.Token {
			return
		}
		sleepCtx(ctx, lease/10)
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
		id := dedupe.ClaimFromContext(ctx).Key.ID
		if err := effect(ctx, tx, e.name, id); err != nil {
			return err
		}
		switch {
		case e.fails(id):
			return errInjected
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
		if e.fails(id) {
			return errInjected
		}
		return nil
	}
}
