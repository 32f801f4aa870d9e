package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestRunConcurrentInProcessRunsOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setSleep(t, 700*time.Millisecond)
	const n = 8
	results := make([]result, n)
	dbtest.Together(n, func(i int) { results[i] = e.cli(t, e.runArgs("nightly")...) })

	outcomes := map[string]int{}
	for i, r := range results {
		rep := report(t, r)
		outcomes[rep.Outcome]++
		switch rep.Outcome {
		case "ran":
			if r.code != 0 || rep.Recorded != "complete" || !strings.Contains(r.stdout, "effect done") {
				t.Errorf("run %d: ran with exit %d recorded %q, stdout %q", i, r.code, rep.Recorded, r.stdout)
			}
		case "in_flight":
			if r.code != exitInFlight {
				t.Errorf("run %d: in flight with exit %d", i, r.code)
			}
		case "skipped":
			if r.code != 0 {
				t.Errorf("run %d: skipped with exit %d", i, r.code)
			}
		default:
			t.Errorf("run %d: outcome %q exit %d\n%s", i, rep.Outcome, r.code, r.stderr)
		}
	}
	if outcomes["ran"] != 1 {
		t.Fatalf("outcomes %v, want exactly one ran", outcomes)
	}
	if got := len(e.lines(t, "start")); got != 1 {
		t.Fatalf("command started %d times, want 1", got)
	}
	// A later run of the complete key exits 0 without running the command.
	e.expectRun(t, "later run", want{code: 0, outcome: "skipped"}, "nightly")
	if got := len(e.lines(t, "end")); got != 1 {
		t.Fatalf("command completed %d times, want 1", got)
	}
	rec := e.inspect(t, "jobs", "nightly")
	if rec.State != "complete" || rec.ResultStatus == nil || *rec.ResultStatus != 0 || rec.Body == nil ||
		!strings.Contains(*rec.Body, "effect done") || rec.ResultHeaders["Command"][0] != os.Args[0] {
		t.Fatalf("stored record = %+v", rec)
	}
}

// TestRunConcurrentProcessesRunsOnce fires real dedupe processes at one key.
func TestRunConcurrentProcessesRunsOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setSleep(t, 700*time.Millisecond)
	const procs = 4
	codes := make([]int, procs)
	outputs := make([]string, procs)
	dbtest.Together(procs, func(p int) {
		cmd := e.process(e.runArgs("backup-2026-01-01")...)
		out, err := cmd.CombinedOutput()
		outputs[p] = string(out)
		codes[p] = exitCodeOf(t, err)
	})
	ran := 0
	for p, code := range codes {
		switch {
		case code == 0 && strings.Contains(outputs[p], `"outcome":"ran"`):
			ran++
		case code == exitInFlight, code == 0 && strings.Contains(outputs[p], `"outcome":"skipped"`):
		default:
			t.Errorf("process %d exited %d:\n%s", p, code, outputs[p])
		}
	}
	if ran != 1 {
		t.Fatalf("%d processes ran the command, want 1:\n%s", ran, strings.Join(outputs, "\n---\n"))
	}
	if got := len(e.lines(t, "start")); got != 1 {
		t.Fatalf("command started %d times, want 1", got)
	}
}

// TestRunKilledLeaseExpiresAndRetryTakesOver SIGKILLs a dedupe process while
// its command runs: the command dies with it, the key stays held until the
// lease runs out, and then a later run takes the key over.
func TestRunKilledLeaseExpiresAndRetryTakesOver(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The lease must outlive the start of the second process below (a Go
	// binary and its connection, slow on a loaded machine).
	const lease = 4 * time.Second
	const firstSleep = 5 * time.Second
	e.setSleep(t, firstSleep)
	cmd := e.process(e.runArgs("export", "--lease", lease.String())...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := e.waitLines(t, "start", 1)[0]
	startedAt := time.Now()
	firstPID := strings.Fields(first)[1]
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	e.setSleep(t, 0)

	// The dead run's lease still holds: another run is told to retry later.
	e.expectRun(t, "run during the dead lease", want{code: exitInFlight, outcome: "in_flight"}, "export", "--lease", lease.String())
	// Once it expired, the next run takes over as attempt 2.
	deadline := time.Now().Add(20 * time.Second)
	for e.inspect(t, "jobs", "export").Lease == "live" {
		if time.Now().After(deadline) {
			t.Fatal("the dead run's lease never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A lease that ran out is not one a failure released.
	if rec := e.inspect(t, "jobs", "export"); rec.Lease != "expired" {
		t.Fatalf("the killed run's lease = %q, want expired", rec.Lease)
	}
	e.expectRun(t, "takeover run", want{code: 0, outcome: "ran", attempt: 2}, "export", "--lease", lease.String())
	// The orphaned command was killed with dedupe: it never finishes.
	time.Sleep(time.Until(startedAt.Add(firstSleep + 500*time.Millisecond)))
	for _, l := range e.lines(t, "end") {
		if strings.Fields(l)[1] == firstPID {
			t.Fatalf("the killed run's command went on and finished: %q", e.lines(t, ""))
		}
	}
	if got := len(e.lines(t, "start")); got != 2 {
		t.Fatalf("starts = %d, want 2", got)
	}
	if rec := e.inspect(t, "jobs", "export"); rec.State != "complete" || rec.Attempts != 2 {
		t.Fatalf("record = %+v", rec)
	}
}

func TestRunFailureReleasesKeyForRetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setStatus(t, 3)
	e.expectRun(t, "failing run", want{code: 3, recorded: "released"}, "load")
	// The key stays in_flight (its row counts the attempts) with the lease
	// ended by the failure: inspect says released, as run did.
	rec := e.inspect(t, "jobs", "load")
	if rec.State != "in_flight" || rec.Lease != "released" || rec.Attempts != 1 || !strings.Contains(rec.LastError, "exit status 3") {
		t.Fatalf("after failure: %+v", rec)
	}
	if r := e.cli(t, "inspect", "--scope", "jobs", "--key", "load"); r.code != 0 ||
		!strings.Contains(r.stdout, "in_flight (released: no attempt holds it") || !strings.Contains(r.stdout, "by the failed attempt") {
		t.Fatalf("inspect text after failure = %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The retry runs at once (no lease to wait for) and succeeds.
	e.setStatus(t, 0)
	e.expectRun(t, "retry", want{code: 0, outcome: "ran", attempt: 2}, "load")
	e.expectRun(t, "after success", want{code: 0, outcome: "skipped"}, "load")
	if got := len(e.lines(t, "end")); got != 2 {
		t.Fatalf("command ran %d times, want 2 (one failure, one success)", got)
	}
}

func TestRunOnFailureCompleteReplaysStatus(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setStatus(t, 4)
	e.expectRun(t, "run", want{code: 4, recorded: "complete"}, "report", "--on-failure", "complete")
	e.setStatus(t, 0)
	e.expectRun(t, "later run", want{code: 4, outcome: "skipped"}, "report", "--on-failure", "complete")
	if got := len(e.lines(t, "start")); got != 1 {
		t.Fatalf("command ran %d times, want 1", got)
	}
}

func TestRunPoisonThenReleaseAllowsAnotherRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setStatus(t, 5)
	e.expectRun(t, "run", want{code: 5, recorded: "failed"}, "sync", "--on-failure", "poison")
	e.setStatus(t, 0)
	e.expectRun(t, "run of a poisoned key", want{code: exitPoisoned, outcome: "poisoned"}, "sync")
	// release without --yes changes nothing.
	if r := e.cli(t, "release", "--scope", "jobs", "--key", "sync"); r.code != exitUsage || !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("release without --yes = %d\n%s", r.code, r.stderr)
	}
	if rec := e.inspect(t, "jobs", "sync"); rec.State != "failed" {
		t.Fatalf("after unconfirmed release: %+v", rec)
	}
	if r := e.cli(t, "release", "--scope", "jobs", "--key", "sync", "--yes"); r.code != 0 {
		t.Fatalf("release --yes = %d\n%s", r.code, r.stderr)
	}
	e.expectRun(t, "run after release", want{code: 0, outcome: "ran", attempt: 1}, "sync")
	if got := len(e.lines(t, "start")); got != 2 {
		t.Fatalf("command ran %d times, want 2", got)
	}
}

func TestRunMaxAttemptsMarksKeyFailed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setStatus(t, 1)
	for attempt := 1; attempt <= 2; attempt++ {
		recorded := "released"
		if attempt == 2 {
			recorded = "failed"
		}
		e.expectRun(t, fmt.Sprint("attempt ", attempt), want{code: 1, attempt: attempt, recorded: recorded}, "flaky", "--max-attempts", "2")
	}
	r := e.cli(t, e.runArgs("flaky", "--max-attempts", "2")...)
	if r.code != exitPoisoned {
		t.Fatalf("third run = %d, want %d\n%s", r.code, exitPoisoned, r.stderr)
	}
	if got := len(e.lines(t, "start")); got != 2 {
		t.Fatalf("command ran %d times, want 2", got)
	}
}

func TestRunRefusesKeyWithAnotherCommand(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if r := e.cli(t, e.runArgs("deploy")...); r.code != 0 {
		t.Fatalf("first run = %d\n%s", r.code, r.stderr)
	}
	expect(t, "other command",
		e.cli(t, "--json", "run", "--scope", "jobs", "--key", "deploy", "--", os.Args[0], effectArg, e.dir, "extra-argument"),
		want{code: exitConflict, outcome: "conflict"})
	if got := len(e.lines(t, "start")); got != 1 {
		t.Fatalf("command ran %d times, want 1", got)
	}
}

func TestRunCommandNotFoundReleasesKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	missing := e.dir + "/no-such-command"
	for attempt := 1; attempt <= 2; attempt++ {
		expect(t, fmt.Sprint("attempt ", attempt), e.cli(t, "--json", "run", "--scope", "jobs", "--key", "missing", "--", missing),
			want{code: exitNotExist, attempt: attempt, recorded: "released"})
	}
	if err := os.WriteFile(missing, []byte("not executable"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := e.cli(t, "run", "--scope", "jobs", "--key", "missing", "--", missing); r.code != exitCannotExec {
		t.Fatalf("non-executable = %d, want %d\n%s", r.code, exitCannotExec, r.stderr)
	}
}

// TestRunInterruptedStopsCommandAndReleasesKey cancels dedupe's context, as
// SIGTERM does, while the command runs.
func TestRunInterruptedStopsCommandAndReleasesKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan result, 1)
	e.setSleep(t, 20*time.Second)
	go func() { done <- e.cliCtx(t, ctx, e.runArgs("etl")...) }()
	e.waitLines(t, "start", 1)
	cancel()
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("interrupted run did not end")
	}
	expect(t, "interrupted run", r, want{code: 128 + int(syscall.SIGTERM), recorded: "released"})
	if got := len(e.lines(t, "end")); got != 0 {
		t.Fatalf("the command finished despite the interruption")
	}
	e.setSleep(t, 0)
	e.expectRun(t, "retry", want{code: 0, outcome: "ran", attempt: 2}, "etl")
}

// TestRunLeaseLostStopsCommand releases a key while its command runs: the
// heartbeat is refused and the command is stopped.
func TestRunLeaseLostStopsCommand(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setSleep(t, 20*time.Second)
	done := make(chan result, 1)
	go func() {
		done <- e.cli(t, e.runArgs("rebuild", "--lease", "900ms", "--heartbeat", "200ms")...)
	}()
	e.waitLines(t, "start", 1)
	if r := e.cli(t, "release", "--scope", "jobs", "--key", "rebuild", "--yes"); r.code != exitInFlight {
		t.Fatalf("release of a live lease without --force = %d, want %d\n%s", r.code, exitInFlight, r.stderr)
	}
	if r := e.cli(t, "release", "--scope", "jobs", "--key", "rebuild", "--yes", "--force"); r.code != 0 {
		t.Fatalf("release --force = %d\n%s", r.code, r.stderr)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("run did not stop after losing its lease")
	}
	expect(t, "run", r, want{code: exitRunFailed, outcome: "lease_lost"})
	if got := len(e.lines(t, "end")); got != 0 {
		t.Fatalf("the command finished despite the lost lease")
	}
}

func TestRunStoresBoundedOutputTail(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.cli(t, e.runArgs("tail", "--tail", "16")...)
	if r.code != 0 {
		t.Fatalf("run = %d\n%s", r.code, r.stderr)
	}
	rec := e.inspect(t, "jobs", "tail")
	// stdout and stderr are copied by two goroutines, so the tail ends with
	// the last line of either.
	if rec.Body == nil || len(*rec.Body) > 16 ||
		!(strings.HasSuffix(*rec.Body, "effect done\n") || strings.HasSuffix(*rec.Body, "effect stderr\n")) {
		t.Fatalf("stored tail = %q, want at most 16 bytes ending in the last output", derefOr(rec.Body))
	}
	if rec.ResultHeaders["Output-Bytes"][0] == "16" {
		t.Fatalf("Output-Bytes = 16, want the full output size")
	}
	// The command saw the key and a derived idempotency key.
	if !strings.Contains(r.stdout, "key=tail idem=") || strings.Contains(r.stdout, "idem= ") {
		t.Fatalf("command environment: %q", r.stdout)
	}
}

// want is what a run must end with; an empty outcome or recorded, or a
// zero attempt, is not checked.
type want struct {
	code              int
	outcome, recorded string
	attempt           int
}

// expect fails the test unless r exited w.code with a report that matches w.
func expect(t *testing.T, what string, r result, w want) {
	t.Helper()
	rep := report(t, r)
	if r.code != w.code || w.outcome != "" && rep.Outcome != w.outcome || w.recorded != "" && rep.Recorded != w.recorded ||
		w.attempt != 0 && rep.Attempt != w.attempt {
		t.Fatalf("%s = exit %d %+v, want %+v\n%s", what, r.code, rep, w, r.stderr)
	}
}

// expectRun runs the test command under key with "dedupe --json run" and
// checks its end with expect.
func (e *env) expectRun(t *testing.T, what string, w want, key string, flags ...string) {
	t.Helper()
	expect(t, what, e.cli(t, e.runArgs(key, flags...)...), w)
}

// process returns the test binary acting as the dedupe CLI with args.
func (e *env) process(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"--database-url", e.db.URL}, args...)...)
	cmd.Env = append(os.Environ(), roleEnv+"=cli")
	return cmd
}

func exitCodeOf(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("process: %v", err)
	return -1
}

func derefOr(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestRunSIGTERMStopsCommandAndReleasesKey sends SIGTERM to a real dedupe
// process, as a scheduler killing the task does.
func TestRunSIGTERMStopsCommandAndReleasesKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setSleep(t, 20*time.Second)
	cmd := e.process(e.runArgs("terminated")...)
	var stderr dbtest.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitLines(t, "start", 1)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("dedupe did not stop after SIGTERM")
	}
	r := result{code: exitCodeOf(t, err), stderr: stderr.String()}
	expect(t, "terminated run", r, want{code: 128 + int(syscall.SIGTERM), recorded: "released"})
	if got := len(e.lines(t, "end")); got != 0 {
		t.Fatal("the command finished despite SIGTERM")
	}
	if rec := e.inspect(t, "jobs", "terminated"); rec.State != "in_flight" || rec.Lease == "live" {
		t.Fatalf("after SIGTERM: %+v, want released (in flight, lease expired)", rec)
	}
}

// TestRunLeaseRunsOutStopsCommand makes every renewal fail (the inbox table
// is locked, as an unreachable database would leave it) while the command
// runs: once the lease is about to run out the command is stopped and run
// exits 125, since another run could take the key over.
func TestRunLeaseRunsOutStopsCommand(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setSleep(t, 20*time.Second)
	done := make(chan result, 1)
	go func() {
		done <- e.cli(t, e.runArgs("outage", "--lease", "900ms", "--heartbeat", "200ms")...)
	}()
	e.waitLines(t, "start", 1)
	tx, err := e.db.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(context.Background(), "LOCK TABLE dedupe_inbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("run did not stop when its lease ran out")
	}
	expect(t, "run", r, want{code: exitRunFailed, outcome: "lease_lost"})
	if got := len(e.lines(t, "end")); got != 0 {
		t.Fatalf("the command finished despite the lease running out")
	}
}

// TestRunReleasedBeforeCompletionRecordsNothing force-releases a key while
// its command runs (3s, ample time for the release), between two heartbeats: the command finishes, but its
// completion is refused (the claim's token is stale) and run exits 125
// instead of recording a key it no longer holds.
func TestRunReleasedBeforeCompletionRecordsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.setSleep(t, 3*time.Second)
	done := make(chan result, 1)
	go func() { done <- e.cli(t, e.runArgs("fenced", "--lease", "1m", "--heartbeat", "50s")...) }()
	e.waitLines(t, "start", 1)
	if r := e.cli(t, "release", "--scope", "jobs", "--key", "fenced", "--yes", "--force"); r.code != 0 {
		t.Fatalf("release --force = %d\n%s", r.code, r.stderr)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("run did not end")
	}
	expect(t, "run", r, want{code: exitRunFailed, outcome: "lease_lost"})
	if got := len(e.lines(t, "end")); got != 1 {
		t.Fatalf("the command finished %d times, want 1", got)
	}
	if r := e.cli(t, "inspect", "--scope", "jobs", "--key", "fenced"); r.code != exitNotFound {
		t.Fatalf("inspect after the refused completion = %d, want %d (nothing recorded)\n%s", r.code, exitNotFound, r.stdout)
	}
}
