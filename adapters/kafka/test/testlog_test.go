package test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// testLog is a logger whose records go to t.Log (shown only on failure, or
// with -v) and are kept for assertions.
type testLog struct {
	logger *slog.Logger
	mu     sync.Mutex
	t      testing.TB
	done   bool
	lines  []string
}

// newTestLog returns a test's logger; it goes quiet once the test and its
// cleanups are over.
func newTestLog(t testing.TB) *testLog {
	l := &testLog{t: t}
	t.Cleanup(func() { // registered first, so it runs last
		l.mu.Lock()
		l.done = true
		l.mu.Unlock()
	})
	l.logger = slog.New(&testHandler{log: l, level: slog.LevelDebug})
	return l
}

// contains reports whether a record holds every one of parts.
func (l *testLog) contains(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}

type testHandler struct {
	log   *testLog
	level slog.Level
	attrs []slog.Attr
}

func (h *testHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *testHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	add := func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	line := b.String()
	h.log.mu.Lock()
	defer h.log.mu.Unlock()
	if h.log.done {
		return nil
	}
	h.log.lines = append(h.log.lines, line)
	h.log.t.Log(line)
	return nil
}

func (h *testHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &testHandler{log: h.log, level: h.level, attrs: append(append([]slog.Attr{}, h.attrs...), as...)}
}

func (h *testHandler) WithGroup(string) slog.Handler { return h }
