package test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// TestConcurrentDuplicateInFlightRequeuedLater: while one worker's
// transaction holds a key, its duplicate on another worker times out on the
// lock (Config.LockTimeout), is held for InFlightDelay and requeued (an
// EventRetried matching dedupe.ErrInFlight, not an attempt), and comes back
// as a duplicate once the first committed: one effect.
func TestConcurrentDuplicateInFlightRequeuedLater(t *testing.T) {
	b := setup(t, setupOpts{})
	events, obs := &eventLog{}, observetest.New()
	b.inbox = observedInbox(t, b, dedupe.Observers(events, obs))
	cfg := fastConfig()
	cfg.Workers = 2
	cfg.LockTimeout = 50 * time.Millisecond
	cfg.InFlightDelay = 100 * time.Millisecond
	release := make(chan struct{})
	var once sync.Once
	entered := make(chan struct{})
	stop := run(t, newRunner(t, b, "", cfg, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if err := insertEffect(ctx, tx, d); err != nil {
			return err
		}
		once.Do(func() {
			close(entered)
			<-release // hold the key until the duplicate was requeued
		})
		return nil
	}))
	b.publish(t, "o-1", "x")
	<-entered
	b.publish(t, "o-1", "x")
	waitFor(t, 20*time.Second, "the duplicate requeued as in flight", func() bool {
		return errors.Is(events.firstErr(dedupe.EventRetried), dedupe.ErrInFlight)
	})
	close(release)
	waitFor(t, 20*time.Second, "the effect, and the requeued copy acked as its duplicate", func() bool {
		return obs.Handled(dedupe.OutcomeClaimed) == 1 && obs.Handled(dedupe.OutcomeDuplicate) == 1
	})
	b.settled(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	if n := b.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'o-1'"); n > 1 {
		t.Fatalf("attempts = %d, want the in-flight copy not counted", n)
	}
}
