package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestBenchTinyRunReportsEveryRow runs the whole program with tiny settings
// so that it cannot rot: every scenario, the inbox sizes and the purge must
// appear with a positive throughput and a ratio where one is due.
func TestBenchTinyRunReportsEveryRow(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-dsn", dbtest.BaseURL(t), "-duration", "150ms", "-warmup", "20ms",
		"-workers", "1,2", "-batch", "10", "-inbox-rows", "2000", "-size-workers", "2", "-transport-msgs", "60", "-markdown"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	out := stdout.String()
	t.Log(out)
	rows := map[string]int{}
	ratios := map[string]int{} // ratio cells by row name
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| scenario") || strings.HasPrefix(line, "| inbox rows") || strings.HasPrefix(line, "| run ") || strings.HasPrefix(line, "| consumer ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		rows[cells[0]]++
		for _, c := range cells {
			if c == "0" && cells[0] != "0" {
				t.Errorf("zero cell in %q", line)
			}
		}
		// The main and transport tables: scenario, workers, msgs/s, p50,
		// p99, latency of, vs, ratio. A row has a ratio exactly when it
		// names a baseline, and a positive throughput.
		if len(cells) == 8 {
			if tp, err := strconv.ParseFloat(cells[2], 64); err != nil || tp <= 0 {
				t.Errorf("throughput %q in %q", cells[2], line)
			}
			if hasBase, hasRatio := cells[6] != "—", strings.HasSuffix(cells[7], "×"); hasBase != hasRatio {
				t.Errorf("baseline %q but ratio %q in %q", cells[6], cells[7], line)
			}
		}
		ratios[cells[0]] += strings.Count(line, "×")
	}
	for _, sc := range scenarios {
		if rows[sc.name] != 2 {
			t.Errorf("scenario %q: %d rows, want 2 (one per worker count)", sc.name, rows[sc.name])
		}
	}
	for name, want := range map[string]int{"hand-written JetStream consumer": 2, "dedupenats.Runner": 2,
		kafkaHandSync: 2, kafkaHandAsync: 2, kafkaRunner: 4, // the runner against each Kafka baseline
		"hand-written outbox relay → JetStream": 2, "dedupe.Relay → JetStream": 2} {
		if rows[name] != want {
			t.Errorf("transport %q: %d rows, want %d", name, rows[name], want)
		}
	}
	for _, want := range []string{"0", "2000", "Handle, no purge", "Handle while Purge runs"} {
		if rows[want] != 1 {
			t.Errorf("row %q: %d, want 1", want, rows[want])
		}
	}
	for _, name := range []string{"2000", "Handle while Purge runs"} {
		if ratios[name] != 1 {
			t.Errorf("row %q: %d ratios, want 1", name, ratios[name])
		}
	}
	if !strings.Contains(out, "purged 2000 of 2000 expired keys") {
		t.Errorf("the purge did not delete every expired key:\n%s", out)
	}
	if strings.Count(out, "×") < 3*2+2+3*2 {
		t.Errorf("missing ratios:\n%s", out)
	}
}

func TestBenchRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-workers", "0"}, {"-workers", "x"}, {"-duration", "0"}, {"-batch", "0"}, {"-inbox-rows", "-5"}, {"stray"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("run %q = %d, want 2", args, code)
		}
		if stdout.Len() != 0 {
			t.Errorf("run %q printed %q", args, stdout.String())
		}
	}
}
