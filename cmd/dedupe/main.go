package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == jobInitArg {
		os.Exit(jobInitMain(os.Args[2:]))
	}
	os.Exit(mainExit(os.Args[1:]))
}

// mainExit runs the CLI on the process's streams; SIGINT and SIGTERM cancel
// its context (dedupe run then stops its command and releases the key).
func mainExit(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}
