package dbtest

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// Logger returns a logger that writes to t.Log, so that go test shows what
// the library logged only for a failing test or with -v. Records that arrive
// after the test ended (a goroutine the test failed to stop) go to the
// package's held log instead of panicking in t.Log; see VerifyTestMain.
func Logger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	// Registered first, so it runs after every other cleanup of the test.
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return heldLog.Write(append([]byte("after "+w.t.Name()+" ended: "), p...))
	}
	w.t.Helper()
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// heldLog keeps the latest records logged through slog.Default (by code
// that was given no logger of its own) in memory: VerifyTestMain prints them
// when the package fails, and with -v they go to stderr as they come.
var heldLog = &ringWriter{max: 1 << 20}

// ringWriter keeps the last max bytes written to it.
type ringWriter struct {
	mu   sync.Mutex
	max  int
	buf  []byte
	lost bool
}

func (r *ringWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		return os.Stderr.Write(p)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	if over := len(r.buf) - r.max; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
		r.lost = true
	}
	return len(p), nil
}

// dump writes what the ring holds to w.
func (r *ringWriter) dump(w io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) == 0 {
		return
	}
	fmt.Fprintln(w, "--- library log of the failed run (slog.Default and records after their test ended):")
	if r.lost {
		fmt.Fprintln(w, "[earlier records dropped]")
	}
	_, _ = w.Write(r.buf)
}

// quietDefaultLogger routes slog.Default into heldLog for the test binary.
func quietDefaultLogger() {
	slog.SetDefault(slog.New(slog.NewTextHandler(heldLog, nil)))
}
