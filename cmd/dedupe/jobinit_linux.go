//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The job's supervisor: "dedupe run" starts dedupe's own executable again
// with jobInitArg, and that process runs CMD. It exists so that no process of
// the job outlives dedupe however dedupe dies, SIGKILL included, when no code
// of dedupe runs any more:
//
//   - pidns: the supervisor is the init (pid 1) of a new PID namespace. When
//     a namespace's init dies, the kernel kills every process in it, and no
//     process can leave a PID namespace (setsid, double forks and daemons
//     stay in it). The supervisor dies with dedupe: its parent-death signal
//     is SIGKILL, and it exits when its lifeline (a pipe whose write end only
//     dedupe holds) reads EOF. Even a SIGKILL of the supervisor itself ends
//     the job. A PID namespace needs CAP_SYS_ADMIN, or a user namespace
//     (unprivileged user namespaces: most distributions allow them, some
//     sysctls, AppArmor policies and container seccomp profiles do not).
//   - subreaper: the supervisor is the job's child subreaper
//     (PR_SET_CHILD_SUBREAPER), so every orphaned descendant is re-parented
//     to it rather than to the system's init; when its lifeline reads EOF it
//     kills all its descendants (found through /proc, until it has no child
//     left) and exits. This holds however dedupe dies, but not if the
//     supervisor itself is SIGKILLed (or OOM-killed) while dedupe lives.
//
// In both modes the job ends with CMD: when CMD exits, whatever it left
// running is killed, and the supervisor exits (with CMD's status) only when
// no process of the job is left, so that dedupe records an outcome, and a
// later run takes the key, only when nothing of the job runs.
//
// Protocol: argv is jobInitArg, mode, "--", CMD's path and arguments. Fd 3 is
// the lifeline (read end), fd 4 the start report (write end): jobStarted once
// CMD runs, else "notexist:" or "cannotexec:" and the reason. SIGTERM, SIGINT
// and SIGHUP are passed on to CMD's process group; SIGUSR1 kills the job.

// jobStarted is the supervisor's report that CMD started.
const jobStarted = "ok"

// Linux prctl options (not in package syscall).
const (
	prSetPdeathsig      = 1
	prSetChildSubreaper = 36
)

// killRescan is how often the supervisor looks again for processes of a job
// it is killing (one forked while it was killing, or re-parented to it).
const killRescan = 20 * time.Millisecond

// jobInitMain is the supervisor's main.
func jobInitMain(args []string) int {
	if len(args) < 3 || args[1] != "--" {
		fmt.Fprintln(os.Stderr, "dedupe: the job supervisor is started by dedupe run, not by hand")
		return exitUsage
	}
	mode, argv := args[0], args[2:]
	// CMD's parent-death signal is tied to this thread.
	runtime.LockOSThread()
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	lifeline, report := os.NewFile(3, "lifeline"), os.NewFile(4, "start report")
	pid1 := mode == containPIDNS && os.Getpid() == 1
	if pid1 {
		// Die with dedupe: set before the lifeline is first read, so that a
		// dedupe that dies from here on is seen one way or the other.
		if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetPdeathsig, uintptr(syscall.SIGKILL), 0); e != 0 {
			fmt.Fprintf(report, "cannotexec:set the supervisor's parent-death signal: %v", e)
			return exitCannotExec
		}
	} else if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
		fmt.Fprintf(report, "cannotexec:make the supervisor a child subreaper: %v", e)
		return exitCannotExec
	}
	gone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, lifeline)
		close(gone)
	}()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Path = argv[0] // resolved by dedupe
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		kind := "cannotexec"
		if errors.Is(err, fs.ErrNotExist) {
			kind = "notexist"
		}
		fmt.Fprintf(report, "%s:%v", kind, err)
		return exitCannotExec
	}
	_, _ = report.WriteString(jobStarted)
	report.Close()
	job := cmd.Process.Pid // and its process group

	type reaped struct {
		pid int
		ws  syscall.WaitStatus
	}
	reapc := make(chan reaped)
	go func() { // reaps every child, CMD and re-parented orphans alike
		defer close(reapc)
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, 0, nil)
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case err != nil: // ECHILD: no process of the job is left
				return
			}
			reapc <- reaped{pid, ws}
		}
	}()

	status := -1
	var rescan <-chan time.Time
	killAll := func() {
		killDescendants(pid1)
		if rescan == nil {
			t := time.NewTicker(killRescan)
			rescan = t.C
		}
	}
	for {
		select {
		case r, ok := <-reapc:
			if !ok {
				if status < 0 {
					status = 128 + int(syscall.SIGKILL)
				}
				return status
			}
			if r.pid == job {
				status = r.ws.ExitStatus()
				if r.ws.Signaled() {
					status = 128 + int(r.ws.Signal())
				}
				killAll() // the job ends with its command
			}
		case s := <-sigs:
			if s == syscall.SIGUSR1 {
				killAll()
			} else if status < 0 {
				_ = syscall.Kill(-job, s.(syscall.Signal))
			}
		case <-gone:
			gone = nil
			if pid1 {
				return 128 + int(syscall.SIGKILL) // the kernel kills the namespace
			}
			killAll()
		case <-rescan:
			killDescendants(pid1)
		}
	}
}

// killDescendants SIGKILLs every process of the job: in a PID namespace's
// init, every other process of the namespace; else every descendant of this
// process found in /proc.
func killDescendants(pid1 bool) {
	if pid1 {
		_ = syscall.Kill(-1, syscall.SIGKILL) // all but the init itself
		return
	}
	for _, pid := range descendants(os.Getpid()) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// descendants lists the processes below root, from the parent of each
// process in /proc.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // it ended
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	for queue := children[root]; len(queue) > 0; {
		pid := queue[0]
		queue = queue[1:]
		out = append(out, pid)
		queue = append(queue, children[pid]...)
	}
	return out
}
