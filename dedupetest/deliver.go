package dedupetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

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
func Deliver[M any](t testing.TB, h Handler[M], msg M, n int) Deliveries {
	t.Helper()
	d := Deliveries{Outcomes: make([]dedupe.Outcome, n), Errs: make([]error, n)}
	Together(n, func(i int) { d.Outcomes[i], d.Errs[i] = h.Handle(context.Background(), msg) })
	return d
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
// deliveries came to.
func UntilSettled[M any](t testing.TB, h Handler[M], msg M, limit int) Deliveries {
	t.Helper()
	var d Deliveries
	for range limit {
		o, err := h.Handle(context.Background(), msg)
		d.Outcomes, d.Errs = append(d.Outcomes, o), append(d.Errs, err)
		switch {
		case err == nil, o == dedupe.OutcomePoisoned, errors.Is(err, dedupe.ErrPoisoned):
			return d
		}
	}
	t.Fatalf("dedupetest: not settled after %d deliveries: %s", limit, d)
	return d
}
