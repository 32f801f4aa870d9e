package test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// TestDatabaseOutageSpendsNoDelivery: while every statement to PostgreSQL is
// cut, the runner holds the delivery and retries in place (EventRetried),
// neither counting an attempt nor requeueing it; once the database answers
// the message commits at its first delivery of a quorum queue (no
// x-delivery-count) on its first attempt.
func TestDatabaseOutageSpendsNoDelivery(t *testing.T) {
	b := setup(t, setupOpts{quorum: true, deliveryLimit: 3})
	var down atomic.Bool
	down.Store(true)
	pool, _ := dbtest.ProxyPool(t, b.db.URL, func(pgproxy.Event) pgproxy.Action {
		if down.Load() {
			return pgproxy.Cut
		}
		return pgproxy.Forward
	})
	obs := observetest.New()
	var delivery, attempt atomic.Int64
	inbox, err := dedupe.New(pool, dedupe.Config{Observer: dedupe.Observers(obs, observetest.OnHandled(func(h dedupe.HandleInfo, d dedupe.HandleDone) {
		if d.Outcome == dedupe.OutcomeClaimed {
			delivery.Store(int64(h.Message.Delivery))
			attempt.Store(int64(d.Attempt))
		}
	}))})
	if err != nil {
		t.Fatal(err)
	}
	b.inbox = inbox
	cfg := fastConfig()
	cfg.DeliveryLimit = 3
	stop := run(t, newRunner(t, b, "", cfg, nil))
	b.publish(t, "o-1", "x")
	waitFor(t, 20*time.Second, "five retries during the outage", func() bool { return obs.Events(dedupe.EventRetried) >= 5 })
	down.Store(false)
	waitFor(t, 20*time.Second, "the effect", func() bool { return b.effects(t) == 1 })
	b.settled(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if delivery.Load() != 1 || attempt.Load() != 1 {
		t.Fatalf("committed at delivery %d, attempt %d; want 1 and 1 (the outage spent neither)", delivery.Load(), attempt.Load())
	}
}
