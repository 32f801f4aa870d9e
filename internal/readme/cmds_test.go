//go:build unix

package readme

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rogpeppe/go-internal/testscript"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// commands are the scripts' own commands, beside testscript's.
func commands() map[string]func(ts *testscript.TestScript, neg bool, args []string) {
	return map[string]func(ts *testscript.TestScript, neg bool, args []string){
		"block":  cmdBlock,
		"status": cmdStatus,
		"sql":    cmdSQL,
		"park":   cmdPark,
		"shape":  cmdShape,
	}
}

// blockEnv are the variables a block sees, from the script's environment.
var blockEnv = append([]string{"WORK", "PATH", "HOME", "TMPDIR", "GOBIN", "DATABASE_URL", "NATS_URL",
	"KAFKA_BROKERS", "ADDR"}, goEnvNames...)

// defaultBlockTimeout bounds a block unless -timeout says otherwise.
const defaultBlockTimeout = 4 * time.Minute

// blockGrace is how long a block's processes get between SIGTERM and
// SIGKILL when it times out.
const blockGrace = 5 * time.Second

// cmdBlock runs a shell block as a user would paste it into bash, but with
// errexit and pipefail set, so that any failing command fails the script:
//
//	block [-timeout 4m] file.sh
//
// It runs in the script's directory, in a process group of its own, with
// the variables of blockEnv. Its stdout and stderr become the command's. A
// block must end what it starts: processes of its group still running when
// bash exits fail the command, and are killed; so is the whole group when
// the block outlasts its timeout.
func cmdBlock(ts *testscript.TestScript, neg bool, args []string) {
	fs := flag.NewFlagSet("block", flag.ContinueOnError)
	timeout := fs.Duration("timeout", defaultBlockTimeout, "")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		ts.Fatalf("usage: block [-timeout d] file.sh")
	}
	script := ts.MkAbs(fs.Arg(0))
	outFile, err := os.CreateTemp(ts.Getenv("TMPDIR"), "block-stdout-")
	ts.Check(err)
	defer outFile.Close()
	errFile, err := os.CreateTemp(ts.Getenv("TMPDIR"), "block-stderr-")
	ts.Check(err)
	defer errFile.Close()

	cmd := exec.Command("bash", "-e", "-o", "pipefail", script)
	cmd.Dir = filepath.Dir(script)
	for _, name := range blockEnv {
		if v := ts.Getenv(name); v != "" {
			cmd.Env = append(cmd.Env, name+"="+v)
		}
	}
	// Files, not pipes: a process the block leaves behind must not keep
	// the command waiting for its output to close.
	cmd.Stdout, cmd.Stderr = outFile, errFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	ts.Check(cmd.Start())
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var runErr, cleanupErr error
	select {
	case runErr = <-done:
	case <-time.After(*timeout):
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(blockGrace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-done
		}
		runErr = fmt.Errorf("timed out after %v", *timeout)
	}
	if syscall.Kill(-pgid, 0) == nil {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		cleanupErr = errors.New("the block left processes running (it must stop what it starts); killed them")
	}

	stdout, _ := os.ReadFile(outFile.Name())
	stderr, _ := os.ReadFile(errFile.Name())
	_, _ = ts.Stdout().Write(stdout)
	_, _ = ts.Stderr().Write(stderr)
	switch {
	case cleanupErr != nil:
		ts.Fatalf("block %s: %v", fs.Arg(0), cleanupErr)
	case runErr != nil && !neg:
		ts.Fatalf("block %s failed: %v", fs.Arg(0), runErr)
	case runErr == nil && neg:
		ts.Fatalf("block %s succeeded unexpectedly", fs.Arg(0))
	}
}

// cmdStatus runs a program like exec and asserts its exact exit code:
//
//	status 3 dedupe inspect --scope s --key absent
func cmdStatus(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: status code program [args...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		got = exit.ExitCode()
	case err != nil:
		ts.Fatalf("%s: %v", args[1], err)
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}

// cmdSQL runs one statement on DATABASE_URL and prints the rows it returns,
// one per line, columns separated by spaces (NULL as "null"):
//
//	sql 'SELECT state, attempts FROM dedupe_inbox WHERE key = $1' o-42
func cmdSQL(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 {
		ts.Fatalf("usage: sql statement [args...]")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ts.Getenv("DATABASE_URL"))
	ts.Check(err)
	defer conn.Close(ctx)
	params := make([]any, len(args)-1)
	for i, a := range args[1:] {
		params[i] = a
	}
	rows, err := conn.Query(ctx, args[0], params...)
	ts.Check(err)
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		ts.Check(err)
		cols := make([]string, len(vals))
		for i, v := range vals {
			if v == nil {
				cols[i] = "null"
			} else {
				cols[i] = fmt.Sprint(v)
			}
		}
		fmt.Fprintln(ts.Stdout(), strings.Join(cols, " "))
	}
	ts.Check(rows.Err())
}

// cmdPark enqueues a message in the outbox of DATABASE_URL and runs a relay
// over it whose broker refuses it for good, so that the relay parks it; the
// message's id goes to $PARKED:
//
//	park topic key payload
func cmdPark(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: park topic key payload")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ts.Getenv("DATABASE_URL"))
	ts.Check(err)
	defer conn.Close(ctx)
	ob, err := outbox.New(conn, outbox.Config{})
	ts.Check(err)
	var id string
	ts.Check(pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		id, err = ob.Enqueue(ctx, tx, outbox.Message{Topic: args[0], Key: args[1], Payload: []byte(args[2])})
		return err
	}))
	relay, err := outbox.NewRelay(ob, outbox.PublishFunc(func(context.Context, *outbox.StoredMessage) error {
		return dedupe.Permanent(errors.New("no such topic: " + args[0]))
	}), outbox.RelayConfig{DisableListen: true, Logger: slog.New(slog.DiscardHandler)})
	ts.Check(err)
	_, err = relay.Cycle(ctx)
	ts.Check(err)
	ts.Setenv("PARKED", id)
}

// shapeNumber matches what cmdShape lets vary: numbers, durations and hex
// ids, any run of letters and digits that starts with a digit.
var shapeNumber = regexp.MustCompile(`[0-9][0-9a-z.]*`)

// cmdShape checks that stdout (or stderr) has the shape of a sample output
// file, as a README shows one: each line of the file must match a line of
// the output in order, with numbers free and runs of spaces equal. Lines
// holding one of the -skip words (which differ by machine) are not checked:
//
//	shape [-skip word]... stdout quickstart.out
func cmdShape(ts *testscript.TestScript, neg bool, args []string) {
	var skip []string
	for len(args) > 2 && args[0] == "-skip" {
		skip, args = append(skip, args[1]), args[2:]
	}
	if neg || len(args) != 2 || (args[0] != "stdout" && args[0] != "stderr") {
		ts.Fatalf("usage: shape [-skip word]... stdout|stderr file")
	}
	got := ts.ReadFile(args[0])
	lines := strings.Split(got, "\n")
	at := 0
next:
	for _, want := range strings.Split(ts.ReadFile(args[1]), "\n") {
		if strings.TrimSpace(want) == "" || containsAny(want, skip) {
			continue
		}
		re := regexp.MustCompile(`^\s*` + shapePattern(strings.TrimSpace(want)) + `\s*$`)
		for ; at < len(lines); at++ {
			if re.MatchString(lines[at]) {
				at++
				continue next
			}
		}
		ts.Fatalf("no line of %s has the shape of %q", args[0], want)
	}
}

// shapePattern turns a sample line into a regular expression.
func shapePattern(line string) string {
	var b strings.Builder
	last := 0
	for _, m := range shapeNumber.FindAllStringIndex(line, -1) {
		b.WriteString(spaces(regexp.QuoteMeta(line[last:m[0]])))
		b.WriteString(`[0-9][0-9a-z.]*`)
		last = m[1]
	}
	b.WriteString(spaces(regexp.QuoteMeta(line[last:])))
	return b.String()
}

var spaceRun = regexp.MustCompile(` +`)

func spaces(s string) string { return spaceRun.ReplaceAllString(s, `\s+`) }

func containsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}
