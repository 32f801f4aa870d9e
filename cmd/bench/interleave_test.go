package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"testing"
	"time"
)

// A row's rounds run each side in two windows of half of -duration, in the
// order A B B A with A alternating between rounds, after one unmeasured
// window per side; a side's round is its two windows summed, and the round's
// ratio compares those sums.
func TestInterleaveRunsABBA(t *testing.T) {
	t.Parallel()
	rep := &report{opts: &options{rounds: 2, duration: 100 * time.Millisecond, warmup: 10 * time.Millisecond}}
	c := &comparison{name: "row", lib: side{name: "lib"}, hand: side{name: "hand"}}
	var order []string
	window := 0
	row, err := rep.interleave(context.Background(), c, 1, true, io.Discard, func(s *side, round int, d time.Duration) (*sample, error) {
		order = append(order, fmt.Sprintf("%s/%d/%v", s.name, round, d))
		window++
		// The library does 900 messages where the hand-written side does
		// 1000, and the machine slows down by 5% of that per window: A B B
		// A leaves each round's ratio at 0.9, where A B would not.
		msgs := int64(1000)
		if s == &c.lib {
			msgs = 900
		}
		return &sample{msgs: msgs * int64(100-5*window) / 100, elapsed: d}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"hand/-1/10ms", "lib/-1/10ms",
		"hand/0/50ms", "lib/0/50ms", "lib/0/50ms", "hand/0/50ms",
		"lib/1/50ms", "hand/1/50ms", "hand/1/50ms", "lib/1/50ms"}
	if !slices.Equal(order, want) {
		t.Fatalf("windows ran %q, want %q", order, want)
	}
	if len(row.lib) != 2 || len(row.hand) != 2 || row.lib[0].elapsed != 100*time.Millisecond || row.hand[1].elapsed != 100*time.Millisecond {
		t.Fatalf("a side's round must be its two windows: lib %+v, hand %+v", row.lib, row.hand)
	}
	// Windows 3-6 are round 1's, 7-10 round 2's.
	for i, wantMsgs := range [][2]int64{{720 + 675, 850 + 700}, {585 + 450, 600 + 550}} {
		if row.lib[i].msgs != wantMsgs[0] || row.hand[i].msgs != wantMsgs[1] {
			t.Fatalf("round %d: lib %d, hand %d messages, want %v", i+1, row.lib[i].msgs, row.hand[i].msgs, wantMsgs)
		}
	}
	for i, r := range row.ratios {
		if math.Abs(r-0.9) > 1e-9 {
			t.Errorf("round %d ratio %.4f, want 0.9: the drift was not shared by both sides", i+1, r)
		}
	}
}
