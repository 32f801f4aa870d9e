package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// outcomeLog checks what Consumer.Handle reports against what the database
// kept: each call gets an attempt number, which its handler writes with the
// effect, and the log records whether Handle reported the attempt committed
// (claimed), not committed (any error but ErrOutcomeUnknown) or unknown. The
// audit then finds every attempt reported committed among the effects and
// none reported not committed: a lost COMMIT reply is not a rollback. The
// transports that call Handle in this process keep one.
type outcomeLog struct {
	next atomic.Int64
	mu   sync.Mutex
	said map[int64]reported
}

// reported is what Handle said of one attempt.
type reported int

const (
	reportedCommitted reported = iota + 1
	reportedNotCommitted
	reportedUnknown
)

func newOutcomeLog() *outcomeLog { return &outcomeLog{said: map[int64]reported{}} }

// handle calls Handle with a fresh attempt number in ctx and records what it
// reported; a nil log (in a worker subprocess, whose numbers would collide
// with the soak's) just calls Handle.
func (l *outcomeLog) handle(ctx context.Context, c *dedupe.Consumer[delivery], d delivery) (dedupe.Outcome, error) {
	if l == nil {
		return c.Handle(ctx, d)
	}
	n := l.next.Add(1)
	outcome, err := c.Handle(context.WithValue(ctx, attemptKey{}, n), d)
	r := reportedNotCommitted
	switch {
	case err == nil && outcome == dedupe.OutcomeClaimed:
		r = reportedCommitted
	case err == nil:
		return outcome, err // a duplicate: the handler did not run
	case outcome == dedupe.OutcomeUnknown || errors.Is(err, dedupe.ErrOutcomeUnknown):
		r = reportedUnknown
	}
	l.mu.Lock()
	l.said[n] = r
	l.mu.Unlock()
	return outcome, err
}

// check compares the reports with the attempts whose effect committed, and
// returns how many reports were wrong and how many outcomes unknown.
func (l *outcomeLog) check(committed map[int64]bool) (wrong, unknown int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for n, r := range l.said {
		switch {
		case r == reportedUnknown:
			unknown++
		case (r == reportedCommitted) != committed[n]:
			wrong++
		}
	}
	return wrong, unknown
}

type attemptKey struct{}

// attemptOf returns the attempt number in ctx, or nil outside outcomeLog.
func attemptOf(ctx context.Context) any {
	if n, ok := ctx.Value(attemptKey{}).(int64); ok {
		return n
	}
	return nil
}

// committedAttempts returns the attempt numbers of a transport's effects.
func (s *soak) committedAttempts(ctx context.Context, transport string) (map[int64]bool, error) {
	rows, err := s.admin.Query(ctx, sqlEffectAttempts, transport)
	if err != nil {
		return nil, err
	}
	out := map[int64]bool{}
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&n}, func() error {
		out[n] = true
		return nil
	})
	return out, err
}
