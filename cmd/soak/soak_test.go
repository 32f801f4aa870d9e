package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/scratch"
)

func TestMain(m *testing.M) {
	// The soak re-executes its own binary as the worker subprocess; in tests
	// that binary is this test binary.
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	dbtest.VerifyTestMain(m)
}

// fields parses the key=value pairs of a report line.
func fields(t *testing.T, line string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("malformed field %q in %q", f, line)
		}
		out[k] = v
	}
	return out
}

func atoi(t *testing.T, m map[string]string, k string) int {
	t.Helper()
	n, err := strconv.Atoi(m[k])
	if err != nil {
		t.Fatalf("field %s=%q: %v", k, m[k], err)
	}
	return n
}

// soak runs the command in-process and returns its exit code and the report
// lines by transport. The run keeps its schema (-keep) for checkDatabase,
// and the test drops it at the end.
func runSoak(t *testing.T, args ...string) (int, map[string]map[string]string, *keptRun) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args = append([]string{"-dsn", dbtest.BaseURL(t), "-keep"}, args...)
	code := run(context.Background(), args, &stdout, &stderr)
	t.Logf("soak %s\n%s%s", strings.Join(args[3:], " "), stderr.String(), stdout.String())
	var k *keptRun
	if m := schemaLine.FindStringSubmatch(stderr.String()); m != nil {
		k = keepSchema(t, m[1])
	}
	lines := map[string]map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if l == "" {
			continue
		}
		f := fields(t, l)
		lines[f["transport"]] = f
	}
	return code, lines, k
}

// schemaLine is the soak's first line on stderr, naming its schema.
var schemaLine = regexp.MustCompile(`soak: seed=\d+ schema=(soak_[0-9a-f]+) `)

// keepSchema connects to the schema a run kept, for checkDatabase, and drops
// it when the test ends.
func keepSchema(t *testing.T, schema string) *keptRun {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbtest.BaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := scratch.Drop(ctx, conn, schema); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		_ = conn.Close(ctx)
	})
	return &keptRun{schema: schema, conn: conn}
}

// keptRun is the schema a run kept.
type keptRun struct {
	schema string
	conn   *pgx.Conn
}

// checkDatabase audits a kept run's schema independently of the soak's own
// audit and report: the effects of each transport are exactly the unique ids
// the generator made for n, dup, workers and seed, one each, and no key of
// any transport is left incomplete.
func checkDatabase(t *testing.T, k *keptRun, n int, dup float64, workers int, seed uint64, transports ...string) {
	t.Helper()
	if k == nil {
		t.Fatal("the run named no schema")
	}
	_, unique := genInputs(n, dup, workers, seed)
	ids := make([]string, 0, len(unique))
	for id := range unique {
		ids = append(ids, id)
	}
	ctx := context.Background()
	tbl := pgx.Identifier{k.schema}.Sanitize()
	for _, tr := range transports {
		var total, distinct, foreign int
		err := k.conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id), count(*) FILTER (WHERE msg_id <> ALL($2))
FROM `+tbl+`.soak_effects WHERE transport = $1`, tr, ids).Scan(&total, &distinct, &foreign)
		if err != nil {
			t.Fatal(err)
		}
		if total != len(unique) || distinct != len(unique) || foreign != 0 {
			t.Errorf("%s in the database: %d effects of %d distinct ids, %d not an input; want %d of %d, 0",
				tr, total, distinct, foreign, len(unique), len(unique))
		}
	}
	var incomplete int
	if err := k.conn.QueryRow(ctx, `SELECT count(*) FROM `+tbl+`.dedupe_inbox WHERE state <> 'complete'`).Scan(&incomplete); err != nil {
		t.Fatal(err)
	}
	if incomplete != 0 {
		t.Errorf("%d inbox keys not complete", incomplete)
	}
}

var lineFormat = regexp.MustCompile(`^transport=\S+ inputs=\d+ unique=\d+ effects=\d+ missing=\d+ duplicated=\d+ faults=\d+ `)

func TestSoakWithFaultsExactlyOneEffectEach(t *testing.T) {
	t.Parallel()
	code, lines, db := runSoak(t, "-n", "800", "-dup", "0.3", "-seed", "42", "-workers", "4",
		"-transports", "handle,leased,batch",
		"-error-rate", "0.05", "-panic-rate", "0.03", "-redeliver-rate", "0.05",
		"-kill-rate", "0.25", "-kills", "2", "-abandon-rate", "0.04", "-late-rate", "0.03",
		"-terminate-every", "20", "-lease", "150ms")
	if code != exitOK {
		t.Fatalf("exit code = %d, want 0", code)
	}
	checkDatabase(t, db, 800, 0.3, 4, 42, "handle", "leased", "batch")
	// Every fault the transport can suffer must have fired at least once, or
	// the run proved less than it claims.
	want := map[string][]string{
		"handle": {"errors", "panics", "terminated", "killed", "redelivered"},
		"leased": {"errors", "terminated", "killed", "redelivered", "abandoned", "late"},
		"batch":  {"errors", "redelivered"},
	}
	for tr, kinds := range want {
		f, ok := lines[tr]
		if !ok {
			t.Fatalf("no report line for %s", tr)
		}
		if f["result"] != "ok" || atoi(t, f, "missing") != 0 || atoi(t, f, "duplicated") != 0 || atoi(t, f, "stuck") != 0 {
			t.Errorf("%s: %v", tr, f)
		}
		if atoi(t, f, "effects") != atoi(t, f, "unique") || atoi(t, f, "inputs") != 800 {
			t.Errorf("%s: effects %s, unique %s, inputs %s", tr, f["effects"], f["unique"], f["inputs"])
		}
		for _, k := range kinds {
			if atoi(t, f, k) == 0 {
				t.Errorf("%s: no %s fault fired: %v", tr, k, f)
			}
		}
	}
}

func TestSoakExternalTransportsWithFaults(t *testing.T) {
	t.Parallel()
	code, lines, db := runSoak(t, "-n", "400", "-dup", "0.3", "-seed", "43", "-workers", "3",
		"-transports", "nats,kafka,kafka-batch,webhook,httpidem,outbox",
		"-error-rate", "0.05", "-panic-rate", "0.03", "-redeliver-rate", "0.05",
		"-kill-rate", "0.3", "-kills", "1", "-restart-every", "60",
		"-terminate-every", "15")
	if code != exitOK {
		t.Fatalf("exit code = %d, want 0", code)
	}
	checkDatabase(t, db, 400, 0.3, 3, 43, "nats", "kafka", "kafka-batch", "webhook", "httpidem", "outbox")
	want := map[string][]string{
		"nats":        {"errors", "panics", "killed", "stopped"},
		"kafka":       {"errors", "panics", "killed", "stopped"},
		"kafka-batch": {"errors", "killed", "stopped"},
		"webhook":     {"errors", "panics", "killed", "stopped", "redelivered"},
		"httpidem":    {"errors", "panics", "killed", "stopped", "redelivered"},
		// The outbox run is too short at this size for the relay subprocess
		// to be killed or a relay restarted every time; the long soak is.
		"outbox": {"errors", "redelivered"},
	}
	for tr, kinds := range want {
		f, ok := lines[tr]
		if !ok {
			t.Fatalf("no report line for %s", tr)
		}
		if f["result"] != "ok" || atoi(t, f, "missing") != 0 || atoi(t, f, "duplicated") != 0 ||
			atoi(t, f, "stuck") != 0 || atoi(t, f, "effects") != atoi(t, f, "unique") || atoi(t, f, "inputs") != 400 {
			t.Errorf("%s: %v", tr, f)
		}
		for _, k := range kinds {
			if atoi(t, f, k) == 0 {
				t.Errorf("%s: no %s fault fired: %v", tr, k, f)
			}
		}
	}
}

// TestSoakCatchesNaiveConsumer proves the audit can fail: a consumer that
// writes effects without claiming keys duplicates them, and the soak says so.
func TestSoakCatchesNaiveConsumer(t *testing.T) {
	t.Parallel()
	code, lines, _ := runSoak(t, "-n", "300", "-dup", "0.3", "-seed", "7", "-transports", "naive",
		"-kills", "0", "-terminate-every", "0")
	if code != exitMismatch {
		t.Fatalf("exit code = %d, want %d", code, exitMismatch)
	}
	f := lines["naive"]
	if f == nil || f["result"] != "MISMATCH" || atoi(t, f, "duplicated") == 0 || atoi(t, f, "effects") <= atoi(t, f, "unique") {
		t.Fatalf("naive report = %v, want duplicated effects", f)
	}
}

func TestSoakReportLineFormat(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-dsn", dbtest.BaseURL(t), "-n", "50", "-transports", "handle",
		"-kills", "0", "-terminate-every", "0"}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit code = %d: %s", code, stderr.String())
	}
	if line := strings.TrimSpace(stdout.String()); !lineFormat.MatchString(line) {
		t.Fatalf("report line %q does not match %v", line, lineFormat)
	}
}

func TestSoakRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-transports", "carrier-pigeon"},
		{"-n", "0"},
		{"-dup", "1"},
		{"-error-rate", "0.9"},
		{"-workers", "0"},
		{"stray"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != exitError {
			t.Errorf("run %q = %d, want %d (stderr %q)", args, code, exitError, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("run %q printed a report: %q", args, stdout.String())
		}
	}
}

// TestAuditCountsEveryMismatch proves that each count of the audit can fail,
// not only "duplicated" (TestSoakCatchesNaiveConsumer): effects written by
// hand leave one input missing, one duplicated and one unknown, and a key
// stuck in flight past its lease, and the report says MISMATCH.
func TestAuditCountsEveryMismatch(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	opts, err := parseOptions([]string{"-dsn", dbtest.BaseURL(t), "-n", "5", "-dup", "0", "-transports", "handle"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := newSoak(ctx, opts, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if len(s.unique) != 5 {
		t.Fatalf("unique = %d, want 5", len(s.unique))
	}
	e := &env{soak: s, name: "audit", scope: "soak-audit"}
	// m-000000 is missing, m-000001 duplicated, x-1 never an input.
	for _, id := range []string{"m-000001", "m-000001", "m-000002", "m-000003", "m-000004", "x-1"} {
		if _, err := s.admin.Exec(ctx, sqlInsertEffect, e.name, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.admin.Exec(ctx, `INSERT INTO dedupe_inbox (scope, key, state, attempts, token, locked_until, created_at, updated_at, expires_at)
VALUES ($1, 'm-000002', 'in_flight', 1, 1, now() - interval '1 minute', now(), now(), now() + interval '1 day')`, e.scope); err != nil {
		t.Fatal(err)
	}
	r, err := s.audit(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	if r.effects != 6 || r.missing != 1 || r.duplicated != 1 || r.unknown != 1 || r.stuck != 1 || r.pastLease != 1 || r.ok() {
		t.Fatalf("audit = %s, want effects=6 missing=1 duplicated=1 unknown=1 stuck=1 expired_leases=1 result=MISMATCH", r)
	}
	if !strings.Contains(r.String(), "result=MISMATCH") {
		t.Fatalf("report line %q does not say MISMATCH", r)
	}
}
