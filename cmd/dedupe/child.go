package main

import (
	"errors"
	"io/fs"
	"os/exec"
	"runtime"
	"syscall"
)

// child is a started command of "dedupe run".
type child struct {
	cmd  *exec.Cmd
	done chan error // receives cmd.Wait's result once
}

// startChild starts cmd from a goroutine locked to its OS thread, and keeps
// that thread until the command ends: on Linux the parent-death signal
// (sysProcAttr) is tied to the thread that forked, and the Go runtime could
// otherwise retire it while the command still runs.
func startChild(cmd *exec.Cmd) (*child, error) {
	cmd.SysProcAttr = sysProcAttr()
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

// terminate asks the command (its process group on Linux) to stop.
func (ch *child) terminate() { _ = signalJob(ch.cmd.Process, syscall.SIGTERM) }

// kill stops the command (its process group on Linux) at once.
func (ch *child) kill() { _ = signalJob(ch.cmd.Process, syscall.SIGKILL) }

// startErrorCode maps a failure to start the command to its exit code.
func startErrorCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return exitNotExist
	}
	return exitCannotExec
}
