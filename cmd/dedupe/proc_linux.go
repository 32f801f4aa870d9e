//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
)

// containHelp is what --contain's help says on this system.
const containHelp = "how every process of CMD is kept inside the job: auto (a PID namespace where permitted, else a subreaper supervisor), " +
	"pidns (a PID namespace, through a user namespace when unprivileged; refuse to run otherwise) or subreaper."

// startChild starts the job's supervisor (jobInitMain, dedupe itself run
// again) under the containment contain asks for, and the supervisor starts
// cmd. It returns once cmd has started, or with the error that kept it from
// starting (exec.ErrNotFound, fs.ErrNotExist: not found).
func startChild(cmd *exec.Cmd, contain string) (*child, error) {
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find dedupe's own executable to supervise the job: %w", err)
	}
	var modes []string
	switch contain {
	case containPIDNS:
		modes = []string{containPIDNS, containUserNS}
	case containSubreaper:
		modes = []string{containSubreaper}
	default:
		modes = []string{containPIDNS, containSubreaper}
	}
	var errs []error
	for _, mode := range modes {
		ch, err := startSupervisor(self, cmd, mode)
		if err == nil || !errors.Is(err, errNoNamespace) {
			return ch, err
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("--contain=%s: %w", contain, errors.Join(errs...))
}

// containUserNS is containPIDNS made through a user namespace, for a dedupe
// without CAP_SYS_ADMIN.
const containUserNS = "pidns-userns"

// errNoNamespace: the kernel refused the namespace (no privilege, user
// namespaces disabled, a seccomp filter).
var errNoNamespace = errors.New("cannot create the namespace")

// startSupervisor starts self as the job's supervisor in mode.
func startSupervisor(self string, cmd *exec.Cmd, mode string) (*child, error) {
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		lifeR.Close()
		lifeW.Close()
		return nil, err
	}
	defer statusR.Close()
	sup := exec.Command(self, append([]string{jobInitArg, mode, "--", cmd.Path}, cmd.Args[1:]...)...)
	sup.Env, sup.Dir = cmd.Env, cmd.Dir
	sup.Stdout, sup.Stderr = cmd.Stdout, cmd.Stderr
	sup.WaitDelay = cmd.WaitDelay
	sup.ExtraFiles = []*os.File{lifeR, statusW} // fds 3 and 4
	// Its own process group: a signal to dedupe's group (a terminal's ^C, a
	// scheduler killing the task's group) reaches dedupe, which stops the job
	// in order, and never the supervisor alone. No Pdeathsig here: Go checks
	// it against getppid, which is 0 in a new PID namespace; the supervisor
	// sets its own and reads its lifeline.
	attr := &syscall.SysProcAttr{Setpgid: true}
	switch mode {
	case containPIDNS:
		attr.Cloneflags = syscall.CLONE_NEWPID
	case containUserNS:
		attr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getuid(), HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getgid(), HostID: os.Getgid(), Size: 1}}
	}
	sup.SysProcAttr = attr
	if mode == containUserNS {
		mode = containPIDNS
	}
	ch := &child{cmd: sup, done: make(chan error, 1), mode: mode, lifeline: lifeW}
	started := make(chan error, 1)
	// The supervisor's parent-death signal is tied to the thread that
	// forked it: keep that thread until the supervisor has ended.
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := sup.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		ch.done <- sup.Wait()
	}()
	err = <-started
	lifeR.Close()
	statusW.Close()
	if err != nil {
		lifeW.Close()
		if attr.Cloneflags != 0 && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) ||
			errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EUSERS) || errors.Is(err, syscall.ENOSYS)) {
			return nil, fmt.Errorf("%w (%s): %w", errNoNamespace, mode, err)
		}
		return nil, fmt.Errorf("start the job's supervisor: %w", err)
	}
	// The supervisor reports whether the command started: "ok", or why not.
	msg, _ := io.ReadAll(statusR)
	if string(msg) == jobStarted {
		return ch, nil
	}
	<-ch.done
	lifeW.Close()
	switch kind, text, _ := strings.Cut(string(msg), ":"); kind {
	case "notexist":
		return nil, fmt.Errorf("%s: %w", text, fs.ErrNotExist)
	case "":
		return nil, fmt.Errorf("the job's supervisor ended before starting the command (%s)", exitDescription(sup.ProcessState))
	default:
		return nil, errors.New(text)
	}
}

// exitDescription says how a process ended.
func exitDescription(ps *os.ProcessState) string {
	if ps == nil {
		return "not started"
	}
	return ps.String()
}

// terminate asks the job to stop: the supervisor passes SIGTERM on to the
// command's process group.
func (ch *child) terminate() { _ = ch.cmd.Process.Signal(syscall.SIGTERM) }

// kill stops every process of the job at once: in a PID namespace by
// killing its init, the supervisor (the kernel then kills every process in
// it); else by asking the supervisor, which kills all its descendants.
func (ch *child) kill() {
	if ch.mode == containPIDNS {
		_ = ch.cmd.Process.Kill()
		return
	}
	_ = ch.cmd.Process.Signal(syscall.SIGUSR1)
}

// release closes the lifeline once the supervisor has ended.
func (ch *child) release() {
	if ch.lifeline != nil {
		ch.lifeline.Close()
	}
}

// exitStatus returns the job's exit status, 128+n when signal n killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
