package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// workerRole makes the test binary run the worker's main, so that tests start
// real worker processes as Airflow would.
const workerRole = "AIRFLOW_WORKER_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(workerRole) == "1" {
		main()
	}
	dbtest.VerifyTestMain(m)
}

// airflowEnv is the environment Airflow gives one try of a task.
func airflowEnv(runID string, try int) map[string]string {
	return map[string]string{
		envDagID:                "payouts_daily",
		envTaskID:               "credit_payouts",
		envRunID:                runID,
		envTry:                  strconv.Itoa(try),
		envLogical:              "2026-01-01T00:00:00+00:00",
		"AIRFLOW_CTX_DAG_OWNER": "finance",
	}
}

type bundle struct{ db *dbtest.DB }

func setup(t *testing.T) *bundle {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 4})
	if err := prepare(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db}
}

// try runs one try of the worker in-process.
func (b *bundle) try(t *testing.T, env map[string]string, args ...string) (int, string) {
	t.Helper()
	env["DATABASE_URL"] = b.db.URL
	var out, errb bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb)
	return code, out.String() + errb.String()
}

// process returns one try of the worker as a real OS process.
func (b *bundle) process(env map[string]string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), workerRole+"=1", "DATABASE_URL="+b.db.URL)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

func (b *bundle) balance(t *testing.T) int {
	t.Helper()
	return b.db.Count(t, "SELECT coalesce(sum(cents), 0) FROM airflow_balance WHERE account = 'payouts'")
}

func (b *bundle) ledger(t *testing.T) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM airflow_ledger")
}

func TestRetryWithNewTryNumberWritesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	code, out := b.try(t, airflowEnv("scheduled__2026-01-01T00:00:00+00:00", 1))
	if code != exitOK || !strings.Contains(out, "wrote run") {
		t.Fatalf("try 1 = %d\n%s", code, out)
	}
	code, out = b.try(t, airflowEnv("scheduled__2026-01-01T00:00:00+00:00", 2))
	if code != exitOK || !strings.Contains(out, "already written") {
		t.Fatalf("try 2 = %d\n%s", code, out)
	}
	if got := b.balance(t); got != 100 {
		t.Fatalf("balance = %d cents, want 100 (one credit)", got)
	}
	if got := b.ledger(t); got != 1 {
		t.Fatalf("ledger rows = %d, want 1", got)
	}
	if got := b.db.Count(t, "SELECT try_number FROM airflow_ledger"); got != 1 {
		t.Fatalf("written by try %d, want 1", got)
	}
	// Another logical run is another key: it writes.
	if code, out := b.try(t, airflowEnv("scheduled__2026-01-02T00:00:00+00:00", 1)); code != exitOK || !strings.Contains(out, "wrote run") {
		t.Fatalf("next run = %d\n%s", code, out)
	}
	if got := b.balance(t); got != 200 {
		t.Fatalf("balance after two runs = %d, want 200", got)
	}
}

// TestConcurrentTriesWriteOnce starts several tries of one run at the same
// instant as real processes (a zombie try and its retries).
func TestConcurrentTriesWriteOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const tries = 4
	outs := make([]string, tries)
	errs := make([]error, tries)
	dbtest.Together(tries, func(i int) {
		var out []byte
		out, errs[i] = b.process(airflowEnv("manual__2026-01-05", i+1), "-hold", "300ms").CombinedOutput()
		outs[i] = string(out)
	})
	wrote := 0
	for i := range tries {
		if errs[i] != nil {
			t.Fatalf("try %d: %v\n%s", i+1, errs[i], outs[i])
		}
		if strings.Contains(outs[i], "wrote run") {
			wrote++
		}
	}
	if wrote != 1 || b.balance(t) != 100 || b.ledger(t) != 1 {
		t.Fatalf("%d tries wrote, balance %d, ledger %d; want 1, 100, 1\n%s", wrote, b.balance(t), b.ledger(t), strings.Join(outs, "\n"))
	}
}

// TestTryKilledMidTransactionRetryWrites SIGKILLs a try after it claimed the
// run and wrote, before its commit: everything rolls back, and the retry
// writes once.
func TestTryKilledMidTransactionRetryWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cmd := b.process(airflowEnv("manual__2026-01-07", 1), "-hold", "30s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "claimed the run") {
				close(claimed)
				break
			}
		}
		for sc.Scan() { // drain
		}
	}()
	select {
	case <-claimed:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("try 1 never claimed the run")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// The retry waits for the server to notice the dead connection, then
	// claims the key the rolled-back try never committed.
	code, out := b.try(t, airflowEnv("manual__2026-01-07", 2))
	if code != exitOK || !strings.Contains(out, "wrote run") {
		t.Fatalf("retry = %d\n%s", code, out)
	}
	if b.balance(t) != 100 || b.ledger(t) != 1 || b.db.Count(t, "SELECT try_number FROM airflow_ledger") != 2 {
		t.Fatalf("balance %d, ledger %d; want 100 written once by try 2", b.balance(t), b.ledger(t))
	}
}

func TestMissingContextWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, missing := range []string{envDagID, envTaskID, envRunID} {
		env := airflowEnv("manual__x", 1)
		delete(env, missing)
		if code, out := b.try(t, env); code != exitUsage || !strings.Contains(out, missing) {
			t.Errorf("without %s = %d\n%s", missing, code, out)
		}
	}
	env := airflowEnv("manual__x", 1)
	env[envTry] = "one"
	if code, _ := b.try(t, env); code != exitUsage {
		t.Errorf("bad try number = %d", code)
	}
	if got := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox") + b.ledger(t); got != 0 {
		t.Fatalf("rows written = %d, want 0", got)
	}
}

func TestKeyNamesTheRunNotTheTry(t *testing.T) {
	t.Parallel()
	get := func(env map[string]string) func(string) string { return func(k string) string { return env[k] } }
	r1, err1 := taskRunFromEnv(get(airflowEnv("manual__1", 1)), -1)
	r2, err2 := taskRunFromEnv(get(airflowEnv("manual__1", 7)), -1)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if r1.Key() != r2.Key() || r1.Key() != "payouts_daily/credit_payouts/manual__1" {
		t.Fatalf("keys %q and %q, want the same dag/task/run key", r1.Key(), r2.Key())
	}
	mapped, _ := taskRunFromEnv(get(airflowEnv("manual__1", 1)), 3)
	if mapped.Key() != r1.Key()+"/3" {
		t.Fatalf("mapped key = %q", mapped.Key())
	}
	long := TaskRun{DagID: strings.Repeat("d", 250), TaskID: strings.Repeat("t", 250), RunID: "r", MapIndex: -1}
	other := long
	other.RunID = "s"
	if k := long.Key(); len(k) > dedupe.MaxKeyLen || k == other.Key() || (dedupe.Key{Scope: "s", ID: k}).Validate() != nil {
		t.Fatalf("long key %q (%d bytes)", k, len(k))
	}
}

// TestHelp: -h lists the Airflow variables the worker reads, the database
// fallback and the exit codes, and exits 0.
func TestHelp(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-h"}, func(string) string { return "" }, &out, &errb)
	if code != exitOK {
		t.Fatalf("-h = %d", code)
	}
	for _, want := range []string{envDagID, envTaskID, envRunID, envTry, envLogical, envExecDate, "DATABASE_URL",
		"postgres://postgres@127.0.0.1:5432/test", "-database-url", "Exit codes"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("-h does not mention %s:\n%s", want, errb.String())
		}
	}
}
