package main

import (
	"sync"
	"unicode/utf8"
)

// tailBuffer keeps the last max bytes written to it: the bounded tail of a
// command's output that "dedupe run" stores with the key. It is safe for the
// two goroutines that copy a command's stdout and stderr.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	total int64
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

// Write keeps the end of p; it never fails.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(len(p))
	if t.max <= 0 {
		return len(p), nil
	}
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return len(p), nil
	}
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		n := copy(t.buf, t.buf[over:])
		t.buf = t.buf[:n]
	}
	return len(p), nil
}

// Bytes returns a copy of the tail, starting at a UTF-8 boundary when the
// output was cut so that text stays valid.
func (t *tailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if t.total > int64(len(b)) {
		cut := 0
		for cut < len(b) && cut < utf8.UTFMax && !utf8.RuneStart(b[cut]) {
			cut++
		}
		b = b[cut:]
	}
	return append([]byte(nil), b...)
}

// Total returns how many bytes were written in all.
func (t *tailBuffer) Total() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}
