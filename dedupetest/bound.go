package dedupetest

import (
	"context"
	"fmt"
	"time"
)

// DefaultTimeout bounds every call of the kit (Deliver, UntilSettled, the
// assertions and faults) when the test has no deadline of its own, or one
// further away: a call that has not finished by then fails the test with
// what the handler is most likely doing wrong, instead of hanging until go
// test's -timeout panics with every goroutine's stack.
const DefaultTimeout = time.Minute

// deadlineMargin is the share of the time left before the test's deadline
// that the kit leaves unused, so that its failure is reported before go
// test's own panic.
const deadlineMargin = 10

// stuckCause is the likely cause of a delivery that does not end.
const stuckCause = "a handler that holds or waits for a second connection: it writes through another pool " +
	"connection (env.Pool, a *sql.DB) instead of the transaction it was given, while more deliveries " +
	"run at once than the pool has connections, so every delivery holds its claim's connection and waits " +
	"for another; or it waits for a lock a concurrent delivery holds. Write through the handler's transaction"

// bound returns the time a kit call may take: DefaultTimeout, or less when
// t's deadline comes sooner.
func bound(t any) time.Duration {
	d := DefaultTimeout
	if td, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := td.Deadline(); ok {
			left := time.Until(deadline)
			if left -= left / deadlineMargin; left < d {
				d = left
			}
		}
	}
	return max(d, time.Millisecond)
}

// callContext returns a context bounded as bound says.
func callContext(t any) (context.Context, context.CancelFunc, time.Duration) {
	d := bound(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	return ctx, cancel, d
}

// stuckError describes deliveries that did not end within their bound d:
// what is "3 of 10 deliveries still running" or "ended by their deadline".
func stuckError(call, what string, d time.Duration) string {
	return fmt.Sprintf("dedupetest: %s: %s after %s (the test's deadline or dedupetest.DefaultTimeout); "+
		"likely cause: %s", call, what, d, stuckCause)
}
