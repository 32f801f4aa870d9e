package main

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
)

// How "dedupe run" keeps every process of a job inside the job (--contain).
// See jobinit_linux.go: outside Linux there is no containment.
const (
	containAuto      = "auto"      // a PID namespace where permitted, else a subreaper supervisor
	containPIDNS     = "pidns"     // a PID namespace, through a user namespace if unprivileged; else refuse
	containSubreaper = "subreaper" // a supervisor that is the job's child subreaper
)

// jobInitArg is the first argument that makes dedupe the job's supervisor
// (jobInitMain, Linux).
const jobInitArg = "__dedupe-run-supervisor"

// child is a started command of "dedupe run": on Linux, the job's supervisor
// (jobInitMain) that runs the command; elsewhere the command itself.
type child struct {
	cmd  *exec.Cmd
	done chan error // receives cmd.Wait's result once
	// mode is the containment in force (containPIDNS, containSubreaper), or
	// "" for none.
	mode string
	// lifeline is the write end of the supervisor's lifeline: it closes
	// when dedupe dies, however it dies.
	lifeline *os.File
}

// startErrorCode maps a failure to start the command to its exit code.
func startErrorCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return exitNotExist
	}
	return exitCannotExec
}
