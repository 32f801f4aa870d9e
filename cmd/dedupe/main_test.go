package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// effectArg makes the test binary act as the command that "dedupe run"
// runs: see effectMain.
const effectArg = "-dedupe-test-effect"

// roleEnv makes the test binary act as the dedupe CLI itself (mainExit), for
// tests that need real, killable OS processes.
const roleEnv = "DEDUPE_TEST_ROLE"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == jobInitArg {
		os.Exit(jobInitMain(os.Args[2:]))
	}
	if len(os.Args) > 2 && os.Args[1] == effectArg {
		os.Exit(effectMain(os.Args[2:]))
	}
	if os.Getenv(roleEnv) == "cli" {
		os.Exit(mainExit(os.Args[1:]))
	}
	dbtest.VerifyTestMain(m)
}

// effectMain is the test command. Its one argument is a directory: it
// appends "start <pid> <attempt>" to dir/effects, writes some output, sleeps
// for the duration in dir/sleep, appends "end <pid>", and exits with the
// number in dir/status (0 when absent). The knobs are files, not arguments,
// so that a test changes them without changing the command line (which
// --fingerprint would refuse).
func effectMain(args []string) int {
	dir := args[0]
	file, status := dir+"/effects", dir+"/status"
	var sleep time.Duration
	if b, err := os.ReadFile(dir + "/sleep"); err == nil {
		if sleep, err = time.ParseDuration(strings.TrimSpace(string(b))); err != nil {
			return 99
		}
	}
	appendLine(file, fmt.Sprintf("start %s %s", hostPID(), os.Getenv("DEDUPE_ATTEMPT")))
	fmt.Fprintf(os.Stdout, "effect stdout key=%s idem=%s\n", os.Getenv("DEDUPE_KEY"), os.Getenv("DEDUPE_IDEMPOTENCY_KEY"))
	fmt.Fprintln(os.Stderr, "effect stderr")
	time.Sleep(sleep)
	appendLine(file, fmt.Sprintf("end %s", hostPID()))
	code := 0
	if b, err := os.ReadFile(status); err == nil {
		code, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	fmt.Fprintln(os.Stdout, "effect done")
	return code
}

// hostPID is the process's pid as the test sees it: on Linux the job runs in
// a PID namespace of its own, where os.Getpid is another number (and the
// same one in two runs), while /proc is the test's.
func hostPID() string {
	if pid, err := os.Readlink("/proc/self"); err == nil {
		return pid
	}
	return strconv.Itoa(os.Getpid())
}

func appendLine(file, line string) {
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		panic(err)
	}
}

// env is one test's database and effect files.
type env struct {
	db     *dbtest.DB
	dir    string
	effect string // the effect file
}

func setup(t *testing.T) *env {
	t.Helper()
	e := &env{db: dbtest.New(t, dbtest.Options{MaxConns: 4}), dir: t.TempDir()}
	e.effect = e.dir + "/effects"
	if r := e.cli(t, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up = %d\n%s", r.code, r.stderr)
	}
	return e
}

// result is one in-process invocation.
type result struct {
	code           int
	stdout, stderr string
}

// cli runs the CLI in-process against the test's schema.
func (e *env) cli(t *testing.T, args ...string) result {
	t.Helper()
	return e.cliCtx(t, context.Background(), args...)
}

func (e *env) cliCtx(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	var out, errb dbtest.Buffer
	code := run(ctx, append([]string{"--database-url", e.db.URL}, args...), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// effectCmd is the command line of the test command.
func (e *env) effectCmd() []string { return []string{os.Args[0], effectArg, e.dir} }

// runArgs is a "dedupe --json run" invocation of the test command.
func (e *env) runArgs(key string, flags ...string) []string {
	args := append([]string{"--json", "run", "--scope", "jobs", "--key", key}, flags...)
	return append(append(args, "--"), e.effectCmd()...)
}

// setStatus sets the test command's exit status.
func (e *env) setStatus(t *testing.T, code int) { e.write(t, "status", strconv.Itoa(code)) }

// setSleep sets how long the test command runs.
func (e *env) setSleep(t *testing.T, d time.Duration) { e.write(t, "sleep", d.String()) }

func (e *env) write(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(e.dir+"/"+name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// lines returns the effect file's lines that start with prefix.
func (e *env) lines(t *testing.T, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(e.effect)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// waitLines waits until the effect file has n lines starting with prefix.
func (e *env) waitLines(t *testing.T, prefix string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if l := e.lines(t, prefix); len(l) >= n {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d %q lines; have %q", n, prefix, e.lines(t, ""))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// report decodes the JSON report "dedupe --json run" writes as the last
// line of stderr.
func report(t *testing.T, r result) runReport {
	t.Helper()
	s := strings.TrimSpace(r.stderr)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	var rep runReport
	if err := json.Unmarshal([]byte(s), &rep); err != nil {
		t.Fatalf("no JSON report on stderr (%v):\n%s", err, r.stderr)
	}
	if rep.Exit != r.code {
		t.Fatalf("report exit %d, process exit %d", rep.Exit, r.code)
	}
	return rep
}

// inspect returns the key's record as JSON fields.
func (e *env) inspect(t *testing.T, scope, key string) recordJSON {
	t.Helper()
	r := e.cli(t, "--json", "inspect", "--scope", scope, "--key", key)
	if r.code != 0 {
		t.Fatalf("inspect %s/%s = %d\n%s", scope, key, r.code, r.stderr)
	}
	var rec recordJSON
	if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil {
		t.Fatalf("inspect output: %v\n%s", err, r.stdout)
	}
	return rec
}
