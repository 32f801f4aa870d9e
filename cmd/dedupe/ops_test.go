package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/outbox"
)

func TestMigrateUpStatusSQLAndNotMigrated(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t, dbtest.Options{MaxConns: 2})
	e := &env{db: db, dir: t.TempDir()}

	r := e.cli(t, "stats")
	if r.code != exitNotMigrated || !strings.Contains(r.stderr, "dedupe migrate up") {
		t.Fatalf("stats before migrate = %d, want %d with a hint\n%s", r.code, exitNotMigrated, r.stderr)
	}
	if r := e.cli(t, "run", "--scope", "s", "--key", "k", "--", "true"); r.code != exitRunFailed || !strings.Contains(r.stderr, "dedupe migrate up") {
		t.Fatalf("run before migrate = %d, want %d with a hint\n%s", r.code, exitRunFailed, r.stderr)
	}
	var st struct {
		Pending    int `json:"pending"`
		Migrations []migrationJSON
	}
	r = e.cli(t, "migrate", "status", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil || st.Pending == 0 || st.Pending != len(st.Migrations) {
		t.Fatalf("status before up = %d %+v %v\n%s", r.code, st, err, r.stderr)
	}
	r = e.cli(t, "--json", "migrate", "up")
	var up struct{ Applied []string }
	if err := json.Unmarshal([]byte(r.stdout), &up); r.code != 0 || err != nil || len(up.Applied) != st.Pending {
		t.Fatalf("migrate up = %d %+v %v\n%s", r.code, up, err, r.stderr)
	}
	if r := e.cli(t, "migrate"); r.code != 0 || !strings.Contains(r.stdout, "up to date") {
		t.Fatalf("second migrate = %d %q", r.code, r.stdout)
	}
	r = e.cli(t, "migrate", "status", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil || st.Pending != 0 || !st.Migrations[0].Applied {
		t.Fatalf("status after up = %d %+v %v", r.code, st, err)
	}
	if r := e.cli(t, "stats"); r.code != 0 {
		t.Fatalf("stats after migrate = %d\n%s", r.code, r.stderr)
	}
	// migrate sql needs no database.
	r = result{}
	var out, errb dbtest.Buffer
	r.code = run(context.Background(), []string{"migrate", "sql", "--table", "jobs_inbox"}, &out, &errb)
	if r.code != 0 || !strings.Contains(out.String(), `CREATE TABLE IF NOT EXISTS "jobs_inbox"`) {
		t.Fatalf("migrate sql = %d\n%s%s", r.code, out.String(), errb.String())
	}
	if r := e.cli(t, "migrate", "down"); r.code != exitUsage {
		t.Fatalf("migrate down = %d, want usage error", r.code)
	}
}

func TestGlobalTableAndSchemaFlags(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Flags after the command name work as well as before it.
	if r := e.cli(t, "migrate", "up", "--schema", e.db.Schema, "--table", "jobs_inbox"); r.code != 0 {
		t.Fatalf("migrate custom table = %d\n%s", r.code, r.stderr)
	}
	r := e.cli(t, append([]string{"--table", "jobs_inbox", "--schema", e.db.Schema}, e.runArgs("custom")...)...)
	if r.code != 0 {
		t.Fatalf("run on custom table = %d\n%s", r.code, r.stderr)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM jobs_inbox WHERE key = 'custom' AND state = 'complete'"); n != 1 {
		t.Fatalf("custom table rows = %d, want 1", n)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != 0 {
		t.Fatalf("default table rows = %d, want 0", n)
	}
	if r := e.cli(t, "inspect", "--scope", "jobs", "--key", "custom"); r.code != exitNotFound {
		t.Fatalf("inspect on the default table = %d, want %d", r.code, exitNotFound)
	}
	if r := e.cli(t, "inspect", "--table", "jobs_inbox", "--scope", "jobs", "--key", "custom"); r.code != 0 ||
		!strings.Contains(r.stdout, "complete") {
		t.Fatalf("inspect --table = %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestInspectShowsRecordOrNotFound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// One prefix, the command's: the library's "dedupe: " is not repeated.
	if r := e.cli(t, "inspect", "--scope", "jobs", "--key", "absent"); r.code != exitNotFound ||
		r.stderr != "dedupe inspect: no such key: scope \"jobs\", key \"absent\"\n" {
		t.Fatalf("absent key = %d\n%s", r.code, r.stderr)
	}
	if r := e.cli(t, "inspect", "--scope", "jobs", "--key", "bad\x01key"); r.code != exitUsage {
		t.Fatalf("control character = %d, want %d", r.code, exitUsage)
	}
	e.setStatus(t, 0)
	if r := e.cli(t, e.runArgs("shown")...); r.code != 0 {
		t.Fatalf("run = %d\n%s", r.code, r.stderr)
	}
	r := e.cli(t, "inspect", "--scope", "jobs", "--key", "shown")
	for _, want := range []string{"state", "complete", "attempts", "result status", "effect done", "lease", "fingerprint"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("inspect text lacks %q:\n%s", want, r.stdout)
		}
	}
	rec := e.inspect(t, "jobs", "shown")
	if rec.State != dedupe.StateComplete || rec.Attempts != 1 || rec.Lease != "none" || rec.Fingerprint == "" || rec.ExpiresAt.IsZero() {
		t.Fatalf("inspect json = %+v", rec)
	}
}

func TestStatsCountsByScopeAndState(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	inbox, err := dedupe.New(e.db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c, err := inbox.Begin(ctx, dedupe.Key{Scope: "api", ID: fmt.Sprint("req-", i)})
		if err != nil || c.Outcome != dedupe.OutcomeClaimed {
			t.Fatalf("begin: %v %v", c, err)
		}
		if i == 0 {
			if err := inbox.Complete(ctx, c, dedupe.Result{Status: 201}); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.setStatus(t, 9)
	if r := e.cli(t, e.runArgs("poisoned", "--on-failure", "poison")...); r.code != 9 {
		t.Fatalf("run = %d\n%s", r.code, r.stderr)
	}
	r := e.cli(t, "stats", "--json")
	var st statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil {
		t.Fatalf("stats = %d %v\n%s", r.code, err, r.stdout)
	}
	got := map[string]scopeStatsJSON{}
	for _, s := range st.Scopes {
		got[s.Scope+"/"+string(s.State)] = s
	}
	if st.Total != 4 || len(got) != 3 ||
		got["api/complete"].Count != 1 || got["api/in_flight"].Count != 2 || got["api/in_flight"].LiveLeases != 2 ||
		got["api/in_flight"].OldestInFlight.IsZero() || got["jobs/failed"].Count != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if st.Outbox == nil || st.Outbox.Pending != 0 || st.Outbox.Table != dedupe.DefaultOutboxTable {
		t.Fatalf("outbox stats = %+v, want an empty outbox", st.Outbox)
	}

	// Two committed messages wait for a relay: the lag shows.
	ob, err := outbox.New(e.db.Pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "o-1", Payload: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	r = e.cli(t, "stats", "--json")
	st = statsJSON{}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Outbox == nil || st.Outbox.Pending != 2 ||
		st.Outbox.Parked != 0 || st.Outbox.OldestPendingSeconds < 0.02 {
		t.Fatalf("outbox stats = %+v %v\n%s", st.Outbox, err, r.stdout)
	}
	r = e.cli(t, "stats")
	for _, want := range []string{"SCOPE", "in_flight", "ago", "outbox dedupe_outbox: 2 pending"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("stats text lacks %q:\n%s", want, r.stdout)
		}
	}

	// Without an outbox table, stats still works and says so.
	e.db.Exec(t, "DROP TABLE dedupe_outbox")
	r = e.cli(t, "stats", "--json")
	st = statsJSON{Outbox: &outboxJSON{}}
	if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil || st.Outbox != nil || st.Total != 4 {
		t.Fatalf("stats without outbox = %d %+v %v\n%s", r.code, st, err, r.stderr)
	}
	if r := e.cli(t, "stats"); r.code != 0 || !strings.Contains(r.stdout, "no such table") {
		t.Fatalf("stats text without outbox:\n%s", r.stdout)
	}
}

func TestPurgeDeletesExpiredInBatchesWithProgress(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	now := time.Now()
	// 2500 keys that expired 30 days ago, 10 that expired 2 hours ago, and
	// one that is fresh.
	claimAt := func(at time.Time, prefix string, n int) {
		t.Helper()
		inbox, err := dedupe.New(e.db.Pool, dedupe.Config{Clock: func() time.Time { return at }, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		keys := make([]dedupe.Key, n)
		for i := range keys {
			keys[i] = dedupe.Key{Scope: "queue", ID: fmt.Sprintf("%s-%d", prefix, i)}
		}
		tx, err := e.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := inbox.ClaimBatch(ctx, tx, keys); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	claimAt(now.Add(-30*24*time.Hour), "old", 2500)
	claimAt(now.Add(-3*time.Hour), "recent", 10)
	claimAt(now, "fresh", 1)

	r := e.cli(t, "purge", "--older-than", "24h", "--batch-size", "1000")
	if r.code != 0 || !strings.Contains(r.stdout, "purged 2500 ") {
		t.Fatalf("purge = %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"1000 keys deleted (batch 1)", "2000 keys deleted (batch 2)", "2500 keys deleted (batch 3)"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("progress lacks %q:\n%s", want, r.stderr)
		}
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != 11 {
		t.Fatalf("rows left = %d, want 11", n)
	}
	r = e.cli(t, "--json", "purge")
	var out struct{ Deleted int64 }
	if err := json.Unmarshal([]byte(r.stdout), &out); r.code != 0 || err != nil || out.Deleted != 10 {
		t.Fatalf("purge of every expired key = %d %+v %v\n%s", r.code, out, err, r.stdout)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'fresh-0'"); n != 1 {
		t.Fatalf("the fresh key was purged")
	}
	if r := e.cli(t, "purge", "--older-than", "-1h"); r.code != exitUsage {
		t.Fatalf("negative --older-than = %d", r.code)
	}
}

func TestReleaseAbsentKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if r := e.cli(t, "release", "--scope", "jobs", "--key", "nope", "--yes"); r.code != exitNotFound ||
		r.stderr != "dedupe release: no such key: scope \"jobs\", key \"nope\"\n" {
		t.Fatalf("release absent = %d, want %d", r.code, exitNotFound)
	}
}

func TestUsageAndHelp(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cases := []struct {
		args []string
		code int
		want string // in stdout or stderr
	}{
		{nil, exitUsage, "Commands:"},
		{[]string{"--help"}, exitOK, "Exit codes:"},
		{[]string{"help"}, exitOK, "run"},
		{[]string{"help", "run"}, exitOK, "Usage: dedupe run"},
		{[]string{"frobnicate"}, exitUsage, "unknown command"},
		{[]string{"--bogus"}, exitUsage, "flag provided but not defined"},
		{[]string{"stats", "--bogus"}, exitUsage, "dedupe stats --help"},
		{[]string{"stats", "extra"}, exitUsage, "unexpected argument"},
		{[]string{"inspect"}, exitUsage, "--scope and --key are required"},
		{[]string{"release", "--scope", "s"}, exitUsage, "--scope and --key are required"},
		{[]string{"run", "--scope", "s", "--key", "k"}, exitUsage, "no command"},
		{[]string{"run", "--scope", "s", "--key", "k", "--on-failure", "ignore", "--", "true"}, exitUsage, "--on-failure"},
		{[]string{"run", "--scope", "s", "--key", "k", "--lease", "1s", "--heartbeat", "2s", "--", "true"}, exitUsage, "--heartbeat"},
		{[]string{"run", "--scope", "s", "--key", strings.Repeat("k", 256), "--", "true"}, exitUsage, "too long"},
		{[]string{"purge", "--batch-size", "0"}, exitUsage, "--batch-size"},
	}
	for _, k := range commands() {
		cases = append(cases, struct {
			args []string
			code int
			want string
		}{[]string{k.name, "--help"}, exitOK, "Usage: dedupe " + k.name})
	}
	for _, c := range cases {
		r := e.cli(t, c.args...)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("dedupe %q = %d, want %d with %q\nstdout: %s\nstderr: %s", c.args, r.code, c.code, c.want, r.stdout, r.stderr)
		}
	}
}

// TestDatabaseURLFallback: --database-url, else DATABASE_URL, else the
// local server every example falls back to.
func TestDatabaseURLFallback(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	if got := databaseURL("", getenv); got != "postgres://postgres@127.0.0.1:5432/test?sslmode=disable" {
		t.Errorf("no flag, no DATABASE_URL: %q", got)
	}
	env["DATABASE_URL"] = "postgres://a@b/c"
	if got := databaseURL("", getenv); got != "postgres://a@b/c" {
		t.Errorf("DATABASE_URL: %q", got)
	}
	if got := databaseURL("postgres://d@e/f", getenv); got != "postgres://d@e/f" {
		t.Errorf("flag: %q", got)
	}
}

// TestBadDatabaseURL: a DATABASE_URL that does not parse is a usage error
// (exit 2) that does not echo the URL; one that parses but does not answer
// fails the run (125). (No URL at all is not an error: TestDatabaseURLFallback.)
// It cannot run in parallel: it sets DATABASE_URL.
func TestBadDatabaseURL(t *testing.T) {
	var out, errb dbtest.Buffer
	t.Setenv("DATABASE_URL", "postgres://u:secret@127.0.0.1:1/x?connect_timeout=1&sslmode=bogus")
	code := run(context.Background(), []string{"stats"}, &out, &errb)
	if code != exitUsage || strings.Contains(errb.String(), "secret") {
		t.Fatalf("bad URL = %d, must not echo the password\n%s", code, errb.String())
	}
	t.Setenv("DATABASE_URL", "postgres://u:secret@127.0.0.1:1/x?connect_timeout=1")
	code = run(context.Background(), []string{"run", "--scope", "s", "--key", "k", "--", "true"}, &out, &errb)
	if code != exitRunFailed {
		t.Fatalf("run without a reachable database = %d, want %d\n%s", code, exitRunFailed, errb.String())
	}
}
