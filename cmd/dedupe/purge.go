package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/exactlyonce/dedupe"
)

// purgeFlags are the flags of purge.
type purgeFlags struct {
	olderThan time.Duration
	batchSize int
}

func purgeCommand() *command {
	return &command{
		name:     "purge",
		synopsis: "purge [--older-than D] [--batch-size N]",
		summary:  "delete expired keys in bounded batches, showing progress",
		about: `purge deletes the keys whose retention ran out more than --older-than ago
(a key expires at its last write plus the inbox's retention), in batches of
--batch-size rows per statement, printing the running total to stderr after
each batch. Keys in a live lease are never deleted, and rows that a consumer
holds locked are skipped. Interrupting it (Ctrl-C) stops after the current
batch and reports what was deleted.

Retention must outlive the transport's longest redelivery delay: a duplicate
that arrives after its key was purged is processed again.`,
		flags: func(fs *flag.FlagSet) any {
			p := &purgeFlags{}
			fs.DurationVar(&p.olderThan, "older-than", 0, "delete keys expired at least this `duration` ago. Defaults to 0 (every expired key).")
			fs.IntVar(&p.batchSize, "batch-size", dedupe.DefaultPurgeBatchSize, "rows deleted per statement.")
			return p
		},
		run: runPurge,
	}
}

func runPurge(ctx context.Context, c *cli, opts any, args []string) int {
	p := opts.(*purgeFlags)
	switch {
	case p.olderThan < 0:
		return c.fail("purge", usagef("--older-than must not be negative"))
	case p.batchSize <= 0:
		return c.fail("purge", usagef("--batch-size must be positive"))
	}
	if err := noArgs(args); err != nil {
		return c.fail("purge", err)
	}
	pool, inbox, err := c.connect(ctx, dedupe.Config{PurgeBatchSize: p.batchSize})
	if err != nil {
		return c.fail("purge", err)
	}
	defer pool.Close()
	start := time.Now()
	batches := 0
	deleted, err := inbox.PurgeProgress(ctx, p.olderThan, func(total int64) {
		batches++
		if !c.g.json {
			fmt.Fprintf(c.stderr, "dedupe purge: %d keys deleted (batch %d)\n", total, batches)
		}
	})
	out := map[string]any{"deleted": deleted, "batches": batches, "seconds": time.Since(start).Seconds()}
	if err != nil {
		out["error"] = err.Error()
	}
	c.emit(c.stdout, out, func(w io.Writer) {
		fmt.Fprintf(w, "purged %d expired keys from %s in %s\n", deleted, inbox.Config().Table, time.Since(start).Round(time.Millisecond))
	})
	if err != nil {
		return c.fail("purge", err)
	}
	return exitOK
}
