package counter

import (
	"context"
	"sync"
	"testing"

	"github.com/exactlyonce/dedupe"
)

// TestCounts counts handlings by outcome and events by name, from many
// goroutines at once.
func TestCounts(t *testing.T) {
	o := New()
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			_, done := o.StartHandle(ctx, dedupe.HandleInfo{})
			outcome := dedupe.OutcomeClaimed
			if i%4 == 0 {
				outcome = dedupe.OutcomeDuplicate
			}
			done(dedupe.HandleDone{Outcome: outcome})
			if i%10 == 0 {
				o.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventRetried})
			}
		})
	}
	wg.Wait()
	if o.Handled(dedupe.OutcomeClaimed) != 75 || o.Handled(dedupe.OutcomeDuplicate) != 25 || o.Ended() != 100 ||
		o.Events(dedupe.EventRetried) != 10 || o.Events(dedupe.EventTerminated) != 0 || o.Handled(dedupe.OutcomePoisoned) != 0 {
		t.Fatalf("counts = %s", o)
	}
	if got, want := o.String(), "claimed=75 duplicate=25 retried=10"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
}
