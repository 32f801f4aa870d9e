//go:build linux

package main

import (
	"os"
	"syscall"
)

// sysProcAttr puts the command in its own process group, so that a signal
// reaches the whole job (a shell and what it started), and asks the kernel to
// SIGKILL it if dedupe dies (SIGKILL, OOM kill): an orphaned command must not
// run on after its lease has expired and another run has taken the key over.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalJob sends sig to the command's process group.
func signalJob(p *os.Process, sig syscall.Signal) error {
	return syscall.Kill(-p.Pid, sig)
}

// exitStatus returns the command's exit status, 128+n when signal n killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
