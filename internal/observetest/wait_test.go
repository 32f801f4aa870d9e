package observetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// TestWaitRepeatedRefusalIsNotProgress: a NATS message without a key whose dead-letter publish keeps failing is
// naked and redelivered forever; every delivery reports refused +
// dead_letter_failed + retried. None of it is progress, so Wait gives up
// at its stall deadline instead of hanging until go test's -timeout.
func TestWaitRepeatedRefusalIsNotProgress(t *testing.T) {
	t.Parallel()
	o := observetest.New()
	ctx := context.Background()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				o.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventRefused, Err: errors.New("no key")})
				o.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventDeadLetterFailed})
				o.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventRetried, Delay: 20 * time.Millisecond})
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	ft := &fatalTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.Wait(ft, 100*time.Millisecond, "a redelivery loop", func() bool { return false })
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Wait did not give up after 30 stall periods of the same message being refused again and again")
	}
}
