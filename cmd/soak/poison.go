package main

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// runPoison soaks the attempt limit: Consumer.Handle with a small
// MaxAttempts (-poison-attempts) on the in-memory broker, where every input
// designed to fail is queued -poison-copies times in a row, so that twice
// -workers consumers take its copies at once, and each failed copy is
// redelivered. Its handler fails those inputs always (an error, or a panic at
// -panic-rate) and never fails the others, which random handler faults would
// otherwise exhaust. The connection faults (terminations, the proxy's) apply;
// there is no worker subprocess, whose SIGKILL would end attempts that no
// process lives to count. The audit checks that each input designed to fail
// ends failed in the inbox and that its handler ran at most MaxAttempts times
// (attemptLog).
func runPoison(ctx context.Context, e *env, inputs []string) error {
	o := e.soak.opts
	var feed []string
	for _, id := range inputs {
		n := 1
		if e.fails(id) {
			n = o.poisonCopies
		}
		for range n {
			feed = append(feed, id)
		}
	}
	e.inputs = feed
	workers := 2 * o.workers
	pool, inbox, err := e.consumerInbox(ctx, int32(workers)+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	runs := newAttemptLog()
	e.attempts = runs
	consumer, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[delivery]{
		Scope: e.scope,
		Key:   func(d delivery) (string, error) { return d.id, nil },
	}, func(ctx context.Context, tx pgx.Tx, d delivery) error {
		if !e.fails(d.id) {
			return effect(ctx, tx, e.name, d.id)
		}
		runs.ran(d.id)
		if err := effect(ctx, tx, e.name, d.id); err != nil {
			return err
		}
		if e.faults.hit(faultPanic) {
			panic("soak: injected panic for " + d.id)
		}
		return errInjected
	})
	if err != nil {
		return err
	}
	b := newBroker(feed, e.faults, o.redelivery, &e.progress.acks)
	log := e.soak.log
	e.outcomes = newOutcomeLog()
	return consumeBroker(ctx, e, b, workers, 1, false, func(ctx context.Context, ds []delivery) []bool {
		id := ds[0].id
		if e.fails(id) {
			defer runs.handling(id)()
		}
		outcome, err := e.outcomes.handle(ctx, consumer, ds[0])
		if e.fails(id) && attemptRecorded(err) {
			runs.recorded(id)
		}
		return []bool{settled(log, id, outcome, err)}
	})
}

// attemptRecorded reports whether err, from Consumer.Handle, says that the
// handler failed and that its attempt was recorded (HandlerError.Recorded).
// When the failure record could not commit (the connection was lost under
// it), the attempt may be uncounted, as the core documents, and the run is
// not counted here either.
func attemptRecorded(err error) bool {
	var he *dedupe.HandlerError
	return errors.As(err, &he) && he.Recorded
}

// attemptLog counts, per key, the runs of the poison transport's handler and,
// of those, the ones whose failed attempt Handle reported recorded; and the
// most calls of Handle for one key that were under way at once.
type attemptLog struct {
	mu         sync.Mutex
	runs       map[string]int
	known      map[string]int
	inHandle   map[string]int
	concurrent int
}

func newAttemptLog() *attemptLog {
	return &attemptLog{runs: map[string]int{}, known: map[string]int{}, inHandle: map[string]int{}}
}

// handling counts a call of Handle for id under way until the returned
// function is called.
func (l *attemptLog) handling(id string) (done func()) {
	l.mu.Lock()
	l.inHandle[id]++
	l.concurrent = max(l.concurrent, l.inHandle[id])
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.inHandle[id]--
		l.mu.Unlock()
	}
}

// maxConcurrent is the most calls of Handle for one key under way at once.
func (l *attemptLog) maxConcurrent() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.concurrent
}

func (l *attemptLog) ran(id string) {
	l.mu.Lock()
	l.runs[id]++
	l.mu.Unlock()
}

func (l *attemptLog) recorded(id string) {
	l.mu.Lock()
	l.known[id]++
	l.mu.Unlock()
}

// get returns the runs of id and how many of them were recorded.
func (l *attemptLog) get(id string) (runs, recorded int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[id], l.known[id]
}
