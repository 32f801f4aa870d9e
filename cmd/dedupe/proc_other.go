//go:build !linux

package main

import (
	"os"
	"syscall"
)

// sysProcAttr returns nil: outside Linux the command is neither put in its
// own process group nor killed when dedupe dies.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalJob signals the command itself (SIGKILL kills it; other signals are
// sent where the platform supports them).
func signalJob(p *os.Process, sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		return p.Kill()
	}
	if err := p.Signal(sig); err != nil {
		return p.Kill()
	}
	return nil
}

// exitStatus returns the command's exit status (128+9 when it was killed and
// the platform reports no status).
func exitStatus(ps *os.ProcessState) int {
	if code := ps.ExitCode(); code >= 0 {
		return code
	}
	return 128 + 9
}
