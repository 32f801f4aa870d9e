package dedupe_test

import (
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
)

func TestBackoffDoublesUpToMax(t *testing.T) {
	t.Parallel()
	b := dedupe.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := b.Delay(i); got != w*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	if got := b.Delay(1 << 20); got != time.Second {
		t.Errorf("Delay(huge) = %v, want the cap", got)
	}
	var last time.Duration
	for _, w := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		last = b.Next(last)
		if last != w*time.Millisecond {
			t.Fatalf("Next = %v, want %v", last, w*time.Millisecond)
		}
	}
	if got := (dedupe.Backoff{}).Delay(3); got != 0 {
		t.Errorf("zero Backoff waits %v", got)
	}
	if got := (dedupe.Backoff{Min: time.Second, Max: time.Millisecond}).Delay(4); got != time.Second {
		t.Errorf("Max below Min: %v, want Min", got)
	}
}

func TestBackoffJitterStaysWithinItsSpread(t *testing.T) {
	t.Parallel()
	b := dedupe.Backoff{Min: time.Second, Max: time.Second, Jitter: 0.2}
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 2000 {
		d := b.Delay(1)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 800*time.Millisecond || hi > time.Second {
		t.Fatalf("jittered delays in [%v, %v], want within [800ms, 1s]", lo, hi)
	}
	if hi-lo < 100*time.Millisecond {
		t.Fatalf("jittered delays in [%v, %v]: not spread", lo, hi)
	}
}
