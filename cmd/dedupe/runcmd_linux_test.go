//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// jobScript is a job of nested shells, a pipeline, a background process and
// a process in a session of its own (out of the job's process group). Each
// of its five processes appends its pid (as the test sees it: the job may run
// in a PID namespace of its own) to D/pids and then waits for D/go;
// whichever sees D/go appends "first <pid>" to D/effects, the effect a
// takeover must never see next to its own. With D/second present it is the
// takeover's job instead: it creates D/go (so that any survivor of the first
// job would write its effect now) and appends "second" to D/effects.
const jobScript = `D=$1
if [ -e "$D/second" ]; then touch "$D/go"; echo second >> "$D/effects"; exit 0; fi
wait_go='read p _ < /proc/self/stat; echo $p >> "$1/pids"; while [ ! -e "$1/go" ]; do sleep 0.02; done; echo "first $p" >> "$1/effects"'
read p _ < /proc/self/stat; echo $p >> "$D/pids"
sh -c "$wait_go" inner "$D" &
setsid sh -c "$wait_go" setsid "$D" &
sh -c "$wait_go" left "$D" | sh -c "$wait_go; cat >/dev/null" right "$D"
wait
true`

// pids reads the pids the job's processes wrote.
func (e *env) pids(t *testing.T) []int {
	t.Helper()
	var out []int
	b, err := os.ReadFile(e.dir + "/pids")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for f := range strings.FieldsSeq(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pids file: %v", err)
		}
		out = append(out, pid)
	}
	return out
}

// alive reports whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// waitPids waits until the job's five processes have written their pids.
func (e *env) waitPids(t *testing.T) []int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if p := e.pids(t); len(p) >= 5 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job's processes did not all start: pids %v", e.pids(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// releaseSurvivors lets any process of the first job that is still alive at
// the end of a test run to its end (and kills it), so that a failing test
// leaves nothing running.
func (e *env) releaseSurvivors(t *testing.T) {
	t.Cleanup(func() {
		_ = os.WriteFile(e.dir+"/go", nil, 0o644)
		for _, pid := range e.pids(t) {
			if alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// expectAllDead fails unless every process of the job has ended within a
// deadline (a generous one: they are killed, not asked to stop).
func expectAllDead(t *testing.T, what string, pids []int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var survivors []int
		for _, pid := range pids {
			if alive(pid) {
				survivors = append(survivors, pid)
			}
		}
		if len(survivors) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of the job's %d processes still run (pids %v of %v)", what, len(survivors), len(pids), survivors, pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRunKilledDedupeLeavesNoJobProcess SIGKILLs a dedupe process while its
// job (nested shells, a pipeline, a background process, a process in its own
// session) runs: every process of the job must be gone well before the lease
// expires, and the run that takes the key over must not overlap any of them.
// Paced by the job's own pid files, not by sleeps.
func TestRunKilledDedupeLeavesNoJobProcess(t *testing.T) {
	for _, contain := range []string{"auto", containPIDNS, containSubreaper} {
		t.Run(contain, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.releaseSurvivors(t)
			const lease = 5 * time.Second // the takeover renews it on a loaded machine
			args := []string{"--json", "run", "--scope", "jobs", "--key", "tree", "--lease", lease.String()}
			if contain != "auto" {
				args = append(args, "--contain", contain)
			}
			args = append(args, "--", "sh", "-c", jobScript, "job", e.dir)
			cmd := e.process(args...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pids := e.waitPids(t)
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			expectAllDead(t, "after dedupe was killed", pids)

			// The takeover, once the lease has run out: it signals D/go, so a
			// survivor would write its effect now; none may exist.
			e.write(t, "second", "")
			deadline := time.Now().Add(30 * time.Second)
			for e.inspect(t, "jobs", "tree").Lease == "live" {
				if time.Now().After(deadline) {
					t.Fatal("the killed run's lease never expired")
				}
				time.Sleep(50 * time.Millisecond)
			}
			expect(t, "takeover", e.cli(t, args...), want{code: 0, outcome: "ran", attempt: 2})
			if got := e.lines(t, ""); len(got) != 1 || got[0] != "second" {
				t.Fatalf("effects = %q, want only the takeover's", got)
			}
		})
	}
}

// TestRunJobEndsWithItsCommand: what the command leaves running when it
// exits (a background process, one in its own session) is killed before run
// records the outcome, so that a job that "finished" cannot run on beside a
// later run of a released key.
func TestRunJobEndsWithItsCommand(t *testing.T) {
	for _, contain := range []string{containPIDNS, containSubreaper} {
		t.Run(contain, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.releaseSurvivors(t)
			script := `D=$1
wait_go='read p _ < /proc/self/stat; echo $p >> "$1/pids"; while [ ! -e "$1/go" ]; do sleep 0.02; done; echo "first $p" >> "$1/effects"'
sh -c "$wait_go" bg "$D" >/dev/null 2>&1 &
setsid sh -c "$wait_go" setsid "$D" >/dev/null 2>&1 &
read p _ < /proc/self/stat; echo $p >> "$D/pids"
while [ $(wc -l < "$D/pids") -lt 3 ]; do sleep 0.02; done
exit 3`
			r := e.cli(t, "--json", "run", "--scope", "jobs", "--key", "leftovers", "--contain", contain, "--", "sh", "-c", script, "job", e.dir)
			expect(t, "run", r, want{code: 3, recorded: "released"})
			expectAllDead(t, "when run returned", e.pids(t))
		})
	}
}

// TestRunLeaseLostKillsJobAtOnce: a command that ignores SIGTERM is killed
// as soon as the lease is lost, not after --kill-after: another run may take
// the key over at once.
func TestRunLeaseLostKillsJobAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.releaseSurvivors(t)
	script := `trap '' TERM; read p _ < /proc/self/stat; echo $p >> "$1/pids"; while :; do sleep 0.02; done`
	done := make(chan result, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- e.cliCtx(t, ctx, "--json", "run", "--scope", "jobs", "--key", "stubborn", "--lease", "1m", "--heartbeat", "100ms",
			"--kill-after", "1h", "--", "sh", "-c", script, "job", e.dir)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for len(e.pids(t)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the job did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := e.cli(t, "release", "--scope", "jobs", "--key", "stubborn", "--yes", "--force"); r.code != 0 {
		t.Fatalf("release --force = %d\n%s", r.code, r.stderr)
	}
	select {
	case r := <-done:
		expect(t, "run", r, want{code: exitRunFailed, outcome: "lease_lost"})
	case <-time.After(20 * time.Second):
		t.Error("the run did not end after losing its lease (waiting for --kill-after)")
		for _, pid := range e.pids(t) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		<-done
		return
	}
	expectAllDead(t, "when run returned", e.pids(t))
}

// TestRunContainFlagValidated: an unknown --contain is a usage error.
func TestRunContainFlagValidated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.cli(t, "run", "--scope", "jobs", "--key", "k", "--contain", "cgroup", "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--contain") {
		t.Fatalf("--contain cgroup = %d\n%s", r.code, r.stderr)
	}
}
