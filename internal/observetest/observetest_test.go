package observetest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

func TestCounts(t *testing.T) {
	t.Parallel()
	o := observetest.New()
	ctx := context.Background()
	end := func(mode string, d dedupe.HandleDone) {
		_, done := o.StartHandle(ctx, dedupe.HandleInfo{Mode: mode})
		done(d)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				end("transactional", dedupe.HandleDone{Outcome: dedupe.OutcomeClaimed, Duration: time.Millisecond})
				end("batch", dedupe.HandleDone{Outcome: dedupe.OutcomeDuplicate})
				o.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventOffsetsCommitted, Count: 3})
			}
		})
	}
	wg.Wait()
	end("batch", dedupe.HandleDone{Outcome: dedupe.OutcomeRetry, Err: dedupe.ErrNotAttempted})
	end("leased", dedupe.HandleDone{Err: errors.New("database down")})
	o.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventRetried})

	for name, c := range map[string]struct{ got, want int64 }{
		"claimed":            {o.Handled(dedupe.OutcomeClaimed), 800},
		"duplicates":         {o.Handled(dedupe.OutcomeDuplicate), 800},
		"batch duplicates":   {o.HandledIn("batch", dedupe.OutcomeDuplicate), 800},
		"batch claimed":      {o.HandledIn("batch", dedupe.OutcomeClaimed), 0},
		"retry":              {o.Handled(dedupe.OutcomeRetry), 1},
		"not attempted":      {o.NotAttempted(), 1},
		"no outcome":         {o.Handled(0), 1},
		"started":            {o.Started(""), 1602},
		"started batch":      {o.Started("batch"), 801},
		"ended":              {o.Ended(), 1602},
		"commits":            {o.Events(dedupe.EventOffsetsCommitted), 800},
		"partitions":         {o.Covered(dedupe.EventOffsetsCommitted), 2400},
		"retried":            {o.Events(dedupe.EventRetried), 1},
		"never reported":     {o.Events(dedupe.EventTerminated), 0},
		"claimed time in ms": {int64(o.ClaimedTime() / time.Millisecond), 800},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", name, c.got, c.want)
		}
	}
	if s := o.String(); !strings.Contains(s, "transactional claimed=800") || !strings.Contains(s, "offsets_committed=800(covering 2400)") {
		t.Errorf("String() = %s", s)
	}
}

func TestWait(t *testing.T) {
	t.Parallel()
	o := observetest.New()
	ctx := context.Background()
	go func() {
		for range 50 {
			_, done := o.StartHandle(ctx, dedupe.HandleInfo{})
			done(dedupe.HandleDone{Outcome: dedupe.OutcomeClaimed})
		}
	}()
	o.Wait(t, 10*time.Second, "50 claimed", func() bool { return o.Handled(dedupe.OutcomeClaimed) == 50 })

	// Retries alone are no progress: the wait fails after the stall.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				o.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventRetried})
				time.Sleep(time.Millisecond)
			}
		}
	}()
	ft := &fatalTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.Wait(ft, 100*time.Millisecond, "what never comes", func() bool { return false })
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not give up")
	}
	if !strings.Contains(ft.msg, "no progress for 100ms waiting for what never comes") {
		t.Fatalf("Wait failed with %q", ft.msg)
	}
}

// fatalTB records Fatalf and ends the goroutine, as testing does.
type fatalTB struct{ msg string }

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestOnEventAndOnHandled(t *testing.T) {
	t.Parallel()
	var events []string
	var handled []dedupe.Outcome
	obs := dedupe.Observers(
		observetest.OnEvent(func(_ context.Context, e dedupe.TransportEvent) { events = append(events, e.Name) }),
		observetest.OnHandled(func(h dedupe.HandleInfo, d dedupe.HandleDone) {
			if h.Mode == "batch" {
				handled = append(handled, d.Outcome)
			}
		}))
	ctx := context.Background()
	_, done := obs.StartHandle(ctx, dedupe.HandleInfo{Mode: "batch"})
	done(dedupe.HandleDone{Outcome: dedupe.OutcomeDuplicate})
	obs.TransportEvent(ctx, dedupe.TransportEvent{Name: dedupe.EventAckFailed})
	if len(events) != 1 || events[0] != dedupe.EventAckFailed || len(handled) != 1 || handled[0] != dedupe.OutcomeDuplicate {
		t.Fatalf("events %v, handled %v", events, handled)
	}
}
