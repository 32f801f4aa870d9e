//go:build !linux

package main

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// containHelp is what --contain's help says on this system.
const containHelp = "ignored on this system: the command is not contained (see the help above)."

// jobInitMain does not exist outside Linux.
func jobInitMain([]string) int { return exitCannotExec }

// startChild starts cmd itself: outside Linux the command is neither put in
// a job of its own nor killed when dedupe dies.
func startChild(cmd *exec.Cmd, _ string) (*child, error) {
	ch := &child{cmd: cmd, done: make(chan error, 1)}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		ch.done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return ch, nil
}

// terminate asks the command to stop (SIGTERM where the platform has it).
func (ch *child) terminate() {
	if err := ch.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = ch.cmd.Process.Kill()
	}
}

// kill stops the command at once.
func (ch *child) kill() { _ = ch.cmd.Process.Kill() }

// exitStatus returns the command's exit status (128+9 when it was killed and
// the platform reports no status).
func exitStatus(ps *os.ProcessState) int {
	if code := ps.ExitCode(); code >= 0 {
		return code
	}
	return 128 + 9
}

// release has nothing to release outside Linux.
func (ch *child) release() {}
