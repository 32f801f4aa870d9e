package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/outbox"
)

// errNoStream is what a broker answers for a subject no stream captures:
// not Permanent (a stream may be created), but it fails every time.
var errNoStream = errors.New("nats: no response from stream")

// TestRelayLoneFailingMessageCountsItsAttemptsAndParks: a message that
// fails alone in its cycle is a failing message, not a broker outage: each
// failure counts toward its attempts and schedules its retry, other keys
// publish in the meantime, and after MaxAttempts it is parked while the later
// messages of its key wait.
func TestRelayLoneFailingMessageCountsItsAttemptsAndParks(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	rec := newRecorder()
	rec.setFail(func(m *outbox.StoredMessage) error {
		if m.Topic == "nowhere" {
			return errNoStream
		}
		return nil
	})
	var parked atomic.Int32
	relay := b.relay(t, rec, outbox.RelayConfig{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: 4 * time.Second,
		Observer: relayHooks{Failed: func(_ *outbox.StoredMessage, _ error, p bool) {
			if p {
				parked.Add(1)
			}
		}}})
	ids := b.enqueue(t,
		outbox.Message{Topic: "nowhere", Key: "a", Payload: []byte("bad")},
		outbox.Message{Topic: "nowhere", Key: "a", Payload: []byte("a2")})
	attempts := func() int {
		return b.db.Count(t, "SELECT attempts FROM dedupe_outbox WHERE message_id = $1", ids[0])
	}
	for attempt := 1; attempt <= 3; attempt++ {
		n, err := relay.Cycle(ctx)
		if err != nil || n != 0 {
			t.Fatalf("attempt %d: cycle = %d, %v; want a counted failure, not an outage", attempt, n, err)
		}
		if got := attempts(); got != attempt {
			t.Fatalf("attempt %d: attempts = %d", attempt, got)
		}
		// Another key flows while the bad message waits for its retry.
		b.enqueue(t, outbox.Message{Topic: "t", Key: "b", Payload: []byte(fmt.Sprint("b", attempt))})
		if n := cycle(t, relay); n != 1 {
			t.Fatalf("attempt %d: other key published %d, want 1", attempt, n)
		}
		b.clock.Advance(5 * time.Second)
	}
	if parked.Load() != 1 {
		t.Fatalf("parked hook calls = %d, want 1", parked.Load())
	}
	p, err := b.outbox.Parked(ctx, 10)
	if err != nil || len(p) != 1 || p[0].ID != ids[0] || p[0].Attempt != 3 || p[0].LastError != errNoStream.Error() {
		t.Fatalf("parked = %+v, %v", p, err)
	}
	b.clock.Advance(time.Hour)
	if n := cycle(t, relay); n != 0 {
		t.Fatalf("the parked key published %d", n)
	}
	if got, _, _ := rec.snapshot(); len(got) != 3 {
		t.Fatalf("published %d, want b1 b2 b3 only", len(got))
	}
}

// TestRelayLoneFailureDoesNotPauseTheRelay: with Run, a lone failing
// message must not send the relay into its outage pause (ten seconds here):
// a message of another key committed right after it is published at once.
func TestRelayLoneFailureDoesNotPauseTheRelay(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	b.outbox, _ = outbox.New(b.db.Pool, outbox.Config{})
	rec := newRecorder()
	rec.setFail(func(m *outbox.StoredMessage) error {
		if m.Topic == "nowhere" {
			return errNoStream
		}
		return nil
	})
	failed := make(chan bool, 16)
	relay := b.relay(t, rec, outbox.RelayConfig{MaxAttempts: 1, MinBackoff: 10 * time.Second, MaxBackoff: 10 * time.Second,
		PollInterval: 50 * time.Millisecond,
		Observer:     relayHooks{Failed: func(_ *outbox.StoredMessage, _ error, parked bool) { failed <- parked }}})
	runRelay(t, relay)
	b.enqueue(t, outbox.Message{Topic: "nowhere", Key: "a"})
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the bad message was never tried")
	}
	// Published within 6s: 60× the usual latency (slack for a loaded
	// machine), and still inside the 8–12s pause of a relay that took the
	// failure for an outage.
	b.enqueue(t, outbox.Message{Topic: "t", Key: "b", Payload: []byte("good")})
	waitFor(t, 6*time.Second, "the other key's message", func() bool {
		got, _, _ := rec.snapshot()
		return len(got) == 1
	})
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL AND attempts = 1"); n != 1 {
		t.Fatalf("parked after its one attempt: %d, want 1", n)
	}
}

// healthCheck is a broker health check the test switches.
type healthCheck struct{ down atomic.Bool }

func (h *healthCheck) check(context.Context) error {
	if h.down.Load() {
		return errors.New("broker unreachable")
	}
	return nil
}

// TestRelayHealthCheckDecidesWhenNothingWasPublished: with a health check,
// a cycle that published nothing is an outage exactly when the check fails,
// whatever the number of keys: a lone failure during an outage counts no
// attempt, and failures of two keys with the broker up are the messages'.
func TestRelayHealthCheckDecidesWhenNothingWasPublished(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	rec := newRecorder()
	var brokerDown atomic.Bool
	rec.setFail(func(m *outbox.StoredMessage) error {
		if brokerDown.Load() || m.Topic == "nowhere" {
			return errNoStream
		}
		return nil
	})
	var hc healthCheck
	relay := b.relay(t, rec, outbox.RelayConfig{MaxAttempts: 2, HealthCheck: hc.check})
	attempts := func() int {
		return b.db.Count(t, "SELECT coalesce(sum(attempts), 0) FROM dedupe_outbox WHERE published_at IS NULL")
	}

	// Outage, one key: not counted.
	brokerDown.Store(true)
	hc.down.Store(true)
	b.enqueue(t, outbox.Message{Topic: "t", Key: "a"})
	for range 3 {
		if _, err := relay.Cycle(ctx); !errors.Is(err, outbox.ErrPublishFailed) {
			t.Fatalf("cycle in an outage = %v, want ErrPublishFailed", err)
		}
	}
	if n := attempts(); n != 0 {
		t.Fatalf("an outage counted %d attempts", n)
	}
	brokerDown.Store(false)
	hc.down.Store(false)
	if n := cycle(t, relay); n != 1 {
		t.Fatalf("after the outage published %d", n)
	}

	// Broker up, two bad keys: each counts, and both are parked.
	b.enqueue(t, outbox.Message{Topic: "nowhere", Key: "x"}, outbox.Message{Topic: "nowhere", Key: "y"})
	for range 2 {
		if n := cycle(t, relay); n != 0 {
			t.Fatal(n)
		}
		b.clock.Advance(time.Hour)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL AND attempts = 2"); n != 2 {
		t.Fatalf("parked after 2 attempts: %d, want 2", n)
	}
}

// checkingPublisher is a recorder that is also a HealthChecker.
type checkingPublisher struct {
	*recorder
	healthCheck
}

func (p *checkingPublisher) CheckHealth(ctx context.Context) error { return p.check(ctx) }

// TestRelayUsesThePublishersHealthCheck: a Publisher implementing
// HealthChecker is asked without configuration, and without any check,
// failures of several keys in a cycle that published nothing are an outage.
func TestRelayUsesThePublishersHealthCheck(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	pub := &checkingPublisher{recorder: newRecorder()}
	pub.setFail(func(*outbox.StoredMessage) error { return errNoStream })
	pub.down.Store(true)
	checked := b.relay(t, pub, outbox.RelayConfig{MaxAttempts: 1})
	b.enqueue(t, outbox.Message{Topic: "t", Key: "a"})
	if _, err := checked.Cycle(ctx); !errors.Is(err, outbox.ErrPublishFailed) {
		t.Fatalf("lone failure with the broker's check down = %v, want an outage", err)
	}
	// Without a check, two keys failing together are an outage...
	plain := b.relay(t, pub.recorder, outbox.RelayConfig{MaxAttempts: 1})
	b.enqueue(t, outbox.Message{Topic: "t", Key: "b"})
	if _, err := plain.Cycle(ctx); !errors.Is(err, outbox.ErrPublishFailed) {
		t.Fatalf("two keys failing = %v, want an outage", err)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE attempts > 0"); n != 0 {
		t.Fatalf("outages counted attempts on %d rows", n)
	}
	// ... and so are two unkeyed messages.
	b.db.Exec(t, "UPDATE dedupe_outbox SET key = ''")
	if _, err := plain.Cycle(ctx); !errors.Is(err, outbox.ErrPublishFailed) {
		t.Fatalf("two unkeyed failing = %v, want an outage", err)
	}
}
