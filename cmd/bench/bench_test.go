package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// tinyArgs are settings that run the whole program in seconds: every row
// runs, with backlogs sized for a tiny run's windows (each transport row's
// ceiling would publish thousands of messages per window, the relay's
// tens of thousands of outbox rows) and no wait for the shared server's
// autovacuum nor CHECKPOINT before a row (on the server the other packages'
// tests share, a checkpoint per row only slowed them).
func tinyArgs(t *testing.T, more ...string) []string {
	return append([]string{"-database-url", dbtest.BaseURL(t), "-duration", "120ms", "-warmup", "30ms", "-rounds", "2",
		"-workers", "2", "-batch", "10", "-probe-ops", "30", "-dup-keys", "200", "-inbox-rows", "2000",
		"-size-workers", "2", "-purge-rows", "3000", "-timeout", "5m", "-markdown",
		"-quiesce-wait", "0", "-checkpoint=false", "-backlog-rate", "2000", "-tx-cpu", "40"}, more...)
}

// mdTables splits a Markdown report into its tables: title → rows of cells.
func mdTables(out string) map[string][][]string {
	tables := map[string][][]string{}
	title := ""
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "#### "):
			title = strings.TrimPrefix(line, "#### ")
		case strings.HasPrefix(line, "| ") && title != "":
			cells := strings.Split(strings.Trim(line, "| "), " | ")
			tables[title] = append(tables[title], cells)
		}
	}
	// Drop the header rows.
	for k, rows := range tables {
		tables[k] = rows[1:]
	}
	return tables
}

// tableOf returns the rows of the table whose title starts with prefix.
func tableOf(t *testing.T, tables map[string][][]string, prefix string) [][]string {
	t.Helper()
	for title, rows := range tables {
		if strings.HasPrefix(title, prefix) {
			return rows
		}
	}
	t.Fatalf("no table %q in %v", prefix, tables)
	return nil
}

// TestBenchTinyRunReportsEveryRow runs the whole program with tiny settings
// so that it cannot rot: every comparison (at one worker count: that every
// count gets its row is TestBenchOnlyPicksRows's part) with both
// throughputs and a ratio from both rounds, the round trips and allocations
// of each side, the inbox size and the purge.
func TestBenchTinyRunReportsEveryRow(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := run(context.Background(), tinyArgs(t), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	out := stdout.String()
	t.Logf("%v\n%s", time.Since(start), out)
	tables := mdTables(out)
	rows := map[string]int{}
	for _, title := range []string{titleCore, titleReference, titleTransport} {
		for _, cells := range tableOf(t, tables, title) {
			name := strings.TrimSuffix(cells[0], " (price of dedup)")
			if ref := name != cells[0]; ref != (title == titleReference) {
				t.Errorf("row %q in the table %q: a reference row goes in its own table, and only there", cells[0], title)
			}
			rows[name]++
			for i, col := range []int{3, 4} {
				if tp, err := strconv.ParseFloat(cells[col], 64); err != nil || tp <= 0 {
					t.Errorf("throughput %d %q in %q", i, cells[col], cells)
				}
			}
			if !strings.HasSuffix(cells[5], "×") || !strings.Contains(cells[6], "–") {
				t.Errorf("ratio %q, range %q in %q", cells[5], cells[6], cells)
			}
			// PostgreSQL's CPU per message, where its processes are
			// visible (a server on this machine), else a dash.
			if cpu := cells[10]; cpu != "—" && !strings.Contains(cpu, " / ") {
				t.Errorf("PG CPU %q in %q", cpu, cells)
			}
		}
	}
	for _, c := range comparisons {
		if rows[c.name] != 1 {
			t.Errorf("comparison %q: %d rows, want 1 (one worker count; TestBenchOnlyPicksRows runs two)", c.name, rows[c.name])
		}
	}
	costs := map[string][]string{}
	for _, cells := range tableOf(t, tables, titleCost) {
		costs[strings.TrimSuffix(cells[0], " (price of dedup)")] = cells
		for _, c := range cells[2:5] {
			if c == "—" || !strings.Contains(c, " / ") {
				t.Errorf("cost %q in %q", c, cells)
			}
		}
	}
	if len(costs) != len(comparisons) {
		t.Errorf("%d cost rows, want %d", len(costs), len(comparisons))
	}
	// The round trips of the core's hot paths, counted at the socket: a new
	// key costs BEGIN+claim (one pipeline), the effect and COMMIT against
	// BEGIN, claim, effect, COMMIT by hand; a duplicate costs the pipeline
	// and ROLLBACK against BEGIN, claim, read, COMMIT. Over database/sql
	// (pgx's stdlib) BEGIN goes alone, then the claim and savepoint in one
	// pipeline, then the effect and COMMIT; a duplicate's read goes in that
	// pipeline too (the probe follows the row's duplicates, so the inbox's
	// recent claims found their keys taken), then ROLLBACK. A new HTTP
	// request costs BEGIN+claim, the order, and the stored response with
	// COMMIT (one pipeline) against BEGIN, claim, order, store, COMMIT; a
	// replay in a stream of replays (as the probe's, after the row's) the
	// pipeline with the read and ROLLBACK against BEGIN, claim, read,
	// COMMIT.
	for name, want := range map[string]string{
		"httpidem, new request":                        "3.00 / 5.00",
		"httpidem, replay":                             "2.00 / 4.00",
		"Consumer.Handle, new key":                     "3.00 / 4.00",
		"Consumer.Handle, duplicate":                   "2.00 / 4.00",
		"Consumer.Handle over database/sql, new key":   "4.00 / 4.00",
		"Consumer.Handle over database/sql, duplicate": "3.00 / 4.00",
		"Inbox.ClaimBatch + effects":                   "0.40 / 0.40",
	} {
		if got := costs[name]; len(got) < 3 || got[2] != want {
			t.Errorf("round trips of %q = %v, want %s", name, got, want)
		}
	}
	sizes := tableOf(t, tables, titleSizes)
	if len(sizes) != 1 || sizes[0][0] != "2000" || !strings.HasSuffix(sizes[0][3], "×") {
		t.Errorf("inbox size rows %q", sizes)
	}
	purge := tableOf(t, tables, titlePurge)
	if len(purge) != 2 || !strings.Contains(purge[1][0], "while") || !strings.HasSuffix(purge[1][6], "×") {
		t.Errorf("purge rows %q", purge)
	}
	// The server-CPU section: every transaction shape, each with a CPU
	// time (the server runs on this machine), the first the baseline.
	txs := tableOf(t, tables, titleTxCPU)
	if len(txs) != len(txVariants) {
		t.Fatalf("server CPU rows %q, want one per shape (%d)", txs, len(txVariants))
	}
	for i, cells := range txs {
		if cells[0] != txVariants[i].name {
			t.Errorf("server CPU row %d is %q, want %q", i, cells[0], txVariants[i].name)
		}
		med, err := strconv.ParseFloat(strings.TrimSuffix(cells[1], " µs"), 64)
		if err != nil || med <= 0 {
			t.Errorf("server CPU median %q in %q", cells[1], cells)
		}
	}
	if txs[0][4] != "+0.0 µs" {
		t.Errorf("the baseline's own difference = %q, want +0.0 µs", txs[0][4])
	}
}

// TestBenchOnlyPicksRows runs the comparisons that -only picks by their
// hand-written side's name (the duplicate rows over pgx and database/sql),
// and nothing else.
func TestBenchOnlyPicksRows(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), tinyArgs(t, "-only", "classify", "-transports=false", "-workers", "1,3"), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	tables := mdTables(stdout.String())
	core := tableOf(t, tables, titleCore)
	// Each picked comparison once per worker count, in the flag's order.
	want := [][2]string{
		{"Consumer.Handle, duplicate", "1"}, {"Consumer.Handle, duplicate", "3"},
		{"Consumer.Handle over database/sql, duplicate", "1"}, {"Consumer.Handle over database/sql, duplicate", "3"},
	}
	if len(core) != len(want) {
		t.Fatalf("rows %q, want the two duplicate rows alone, at 1 and 3 workers", core)
	}
	for i, w := range want {
		if core[i][0] != w[0] || core[i][2] != w[1] {
			t.Errorf("row %d = %q at %q workers, want %q at %s", i, core[i][0], core[i][2], w[0], w[1])
		}
	}
	if len(tables) != 2 {
		t.Errorf("tables %v, want the core and the cost table", tables)
	}
}

func TestBenchRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-workers", "0"}, {"-workers", "x"}, {"-duration", "0"}, {"-batch", "0"}, {"-inbox-rows", "-5"},
		{"-rounds", "0"}, {"-rounds", "1"}, {"-rounds", "5"}, {"-probe-ops", "0"}, {"-purge-rows", "x"}, {"-timeout", "0"}, {"stray"},
		{"-quiesce-wait", "-1s"}, {"-backlog-rate", "-1"}, {"-tx-cpu", "-1"},
		{"-database-url", "postgres://postgres@db.example.com:5432/test"},
		{"-database-url", "postgres://postgres@10.0.0.7:5432/test"},
		{"-dsn", "postgres://postgres@10.0.0.7:5432/test"}, // the deprecated name, still read
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

func TestLoopbackHosts(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "localhost": true, "/var/run/postgresql": true, "127.1.2.3": true,
		"10.0.0.7": false, "db.example.com": false, "": false,
	} {
		if got := isLoopback(host); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", host, got, want)
		}
	}
	if err := loopbackOnly("postgres://u@127.0.0.1:5432/x?sslmode=disable"); err != nil {
		t.Errorf("loopback refused: %v", err)
	}
}

func TestProcTicks(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no procfs on this system: the PG CPU column reads —")
	}
	if _, ok := procTicks(os.Getpid()); !ok {
		t.Fatal("cannot read this process's CPU times")
	}
	got, ok := cpuSince(map[int32]int64{1: 10, 2: 5}, map[int32]int64{1: 15, 2: 5, 3: 7})
	if !ok || got != 12 {
		t.Errorf("cpuSince = %d, %v; want 12 (5 more, and 7 for a new backend)", got, ok)
	}
	if _, ok := cpuSince(nil, map[int32]int64{1: 1}); ok {
		t.Error("cpuSince of a failed reading reported ok")
	}
}
