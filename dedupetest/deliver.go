package dedupetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
)

// Handler is what Deliver drives: a dedupe.Consumer, or a transport
// adapter's handling of one message.
type Handler[M any] interface {
	Handle(ctx context.Context, msg M) (dedupe.Outcome, error)
}

// Deliveries are the outcomes of delivering one message several times.
type Deliveries struct {
	Outcomes []dedupe.Outcome
	Errs     []error
}

// Count returns how many deliveries came to o.
func (d Deliveries) Count(o dedupe.Outcome) int {
	n := 0
	for _, got := range d.Outcomes {
		if got == o {
			n++
		}
	}
	return n
}

// ExactlyOnce fails the test unless exactly one delivery ran the handler
// (OutcomeClaimed) and every other one was absorbed as a duplicate.
func (d Deliveries) ExactlyOnce(t testing.TB) {
	t.Helper()
	if c, dup := d.Count(dedupe.OutcomeClaimed), d.Count(dedupe.OutcomeDuplicate); c != 1 || dup != len(d.Outcomes)-1 {
		t.Fatalf("dedupetest: %d deliveries: %d claimed, %d duplicates, want 1 and %d (%s)",
			len(d.Outcomes), c, dup, len(d.Outcomes)-1, d)
	}
}

// String lists the outcomes and errors.
func (d Deliveries) String() string {
	s := ""
	for i, o := range d.Outcomes {
		s += fmt.Sprintf("[%d] %v", i, o)
		if d.Errs[i] != nil {
			s += fmt.Sprintf(" (%v)", d.Errs[i])
		}
		s += "; "
	}
	return s
}

// Deliver hands msg to h n times at the same instant (n goroutines released
// together by a barrier) and returns what each delivery came to: the way to
// fire duplicates concurrently rather than one after another, as a broker's
// redelivery, a provider's retry and a double click do.
//
// Every delivery's context ends at the test's deadline (less a margin) or
// after DefaultTimeout, whichever comes first. Deliver fails the test, and
// never hangs, when deliveries are still running then, or ended because
// their context did: the message names the likely cause, a handler holding
// its transaction's connection while it waits for a second one.
func Deliver[M any](t testing.TB, h Handler[M], msg M, n int) Deliveries {
	t.Helper()
	ctx, cancel, d := callContext(t)
	defer cancel()
	res := Deliveries{Outcomes: make([]dedupe.Outcome, n), Errs: make([]error, n)}
	var mu sync.Mutex
	finished := 0
	done := make(chan struct{})
	go func() {
		Together(n, func(i int) {
			o, err := h.Handle(ctx, msg)
			mu.Lock()
			res.Outcomes[i], res.Errs[i] = o, err
			finished++
			mu.Unlock()
		})
		close(done)
	}()
	// A handler that ignores its context must not hold the test: wait a
	// grace period for the deliveries to see their context end, then fail.
	select {
	case <-done:
	case <-ctx.Done():
		select {
		case <-done:
		case <-time.After(stuckGrace):
			mu.Lock()
			running := n - finished
			mu.Unlock()
			t.Fatal(stuckError("Deliver", fmt.Sprintf("%d of %d deliveries still running", running, n), d) + ignoresContext)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("%s\n%s", stuckError("Deliver", fmt.Sprintf("%d of %d deliveries ended by their deadline", countDeadline(res.Errs), n), d), res)
	}
	return res
}

// ignoresContext completes the failure of a delivery that outlived its
// context.
const ignoresContext = "; a delivery still running after its context ended also ignores that context (pass ctx to every call that may wait)"

// stuckGrace is how long a delivery whose context ended may take to return.
const stuckGrace = 5 * time.Second

// countDeadline counts the deliveries that ended because their context did.
func countDeadline(errs []error) int {
	c := 0
	for _, err := range errs {
		if errors.Is(err, context.DeadlineExceeded) {
			c++
		}
	}
	return c
}

// Together runs f in n goroutines released at the same instant and waits for
// all of them.
func Together(n int, f func(i int)) {
	var start, done sync.WaitGroup
	start.Add(1)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			start.Wait()
			f(i)
		}()
	}
	start.Done()
	done.Wait()
}

// UntilSettled delivers msg to h again and again (one at a time, at most
// limit times) until a delivery is claimed, a duplicate or poisoned, as a
// broker redelivers a message its consumer failed, and returns what the
// deliveries came to. All of them together are bounded as Deliver's are.
func UntilSettled[M any](t testing.TB, h Handler[M], msg M, limit int) Deliveries {
	t.Helper()
	ctx, cancel, bd := callContext(t)
	defer cancel()
	var d Deliveries
	for range limit {
		type handled struct {
			o   dedupe.Outcome
			err error
		}
		one := make(chan handled, 1)
		go func() {
			o, err := h.Handle(ctx, msg)
			one <- handled{o, err}
		}()
		var r handled
		select {
		case r = <-one:
		case <-ctx.Done():
			select {
			case r = <-one:
			case <-time.After(stuckGrace):
				t.Fatalf("%s%s\n%s", stuckError("UntilSettled", fmt.Sprintf("delivery %d still running", len(d.Outcomes)+1), bd), ignoresContext, d)
			}
		}
		d.Outcomes, d.Errs = append(d.Outcomes, r.o), append(d.Errs, r.err)
		if ctx.Err() != nil {
			t.Fatalf("%s\n%s", stuckError("UntilSettled", fmt.Sprintf("delivery %d ended by its deadline", len(d.Outcomes)), bd), d)
		}
		switch {
		case r.err == nil, r.o == dedupe.OutcomePoisoned, errors.Is(r.err, dedupe.ErrPoisoned):
			return d
		}
	}
	t.Fatalf("dedupetest: not settled after %d deliveries: %s", limit, d)
	return d
}
