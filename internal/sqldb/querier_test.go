package sqldb

import (
	"testing"
	"time"
)

// TestIntervalsAndArraysAsText: durations and slices go to database/sql as
// PostgreSQL text, and intervals in PostgreSQL's default output read back
// as durations (a month 30 days, a year 12 months).
func TestIntervalsAndArraysAsText(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"00:00:01.5":               1500 * time.Millisecond,
		"-00:00:00.000001":         -time.Microsecond,
		"2 days 03:00:00":          51 * time.Hour,
		"1 year 1 mon -1 days":     (360 + 30 - 1) * 24 * time.Hour,
		"49:00:01.5":               49*time.Hour + 1500*time.Millisecond,
		"1 mon 2 days 00:00:00.25": 32*24*time.Hour + 250*time.Millisecond,
	} {
		if got, err := ParseInterval(in); err != nil || got != want {
			t.Errorf("ParseInterval(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"1", "1 fortnight", "x days", "1:2"} {
		if _, err := ParseInterval(bad); err == nil {
			t.Errorf("ParseInterval(%q): no error", bad)
		}
	}
	args := Args([]any{time.Second, []string{`a"b`, `c\d`}, []int64{1, 2}, [][]byte{{0xab}, nil}, "keep"})
	for n, want := range []any{"1000000 microseconds", `{"a\"b","c\\d"}`, "{1,2}", `{"\\xab",NULL}`, "keep"} {
		if args[n] != want {
			t.Errorf("arg %d = %#v, want %#v", n, args[n], want)
		}
	}
	plain := []any{"a", 1}
	if got := Args(plain); &got[0] != &plain[0] {
		t.Error("arguments that need no conversion were copied")
	}
}
