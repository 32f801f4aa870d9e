package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/exactlyonce/dedupe"
)

// releaseFlags are the flags of release.
type releaseFlags struct {
	keyFlags
	yes, force bool
}

func releaseCommand() *command {
	return &command{
		name:     "release",
		synopsis: "release --scope S --key K --yes [--force]",
		summary:  "delete one key so that the next delivery or run claims it afresh",
		about: `release deletes one key whatever its state, after a human decided that the
work should run again: a key marked failed (poisoned), a stuck in-flight key,
or a complete key whose effect was undone. It never asks interactively: it
shows the key and does nothing unless --yes is given (exit 2). A key in a live
lease is held by a running attempt; releasing it fences that attempt off and
lets another start at once, so it is refused (exit 75) unless --force is also
given.`,
		flags: func(fs *flag.FlagSet) any {
			r := &releaseFlags{}
			r.register(fs)
			fs.BoolVar(&r.yes, "yes", false, "really release the key. Defaults to false (show it and exit 2).")
			fs.BoolVar(&r.force, "force", false, "release even a key in a live lease. Defaults to false.")
			return r
		},
		run: runRelease,
	}
}

func runRelease(ctx context.Context, c *cli, opts any, args []string) int {
	r := opts.(*releaseFlags)
	key, err := requireKey(r.scope, r.key)
	if err == nil {
		err = noArgs(args)
	}
	if err != nil {
		return c.fail("release", err)
	}
	pool, inbox, err := c.connect(ctx, dedupe.Config{})
	if err != nil {
		return c.fail("release", err)
	}
	defer pool.Close()
	rec, err := inbox.Lookup(ctx, key)
	if err != nil {
		return c.fail("release", keyNotFound(key, err))
	}
	shown := newRecordJSON(rec)
	if !r.yes {
		if !c.g.json {
			writeTable(c.stderr, shown.writeText)
		}
		return c.fail("release", usagef("not released: pass --yes to release %s", key))
	}
	release := inbox.ReleaseIdle // refuses a live lease in the same statement
	if r.force {
		release = inbox.Release
	}
	if err := release(ctx, key); errors.Is(err, dedupe.ErrInFlight) {
		return c.fail("release", fmt.Errorf("%w: %s is held by a running attempt for %s more; pass --force to release it anyway",
			dedupe.ErrInFlight, key, shown.LeaseRemaining))
	} else if err != nil {
		return c.fail("release", keyNotFound(key, err))
	}
	c.emit(c.stdout, map[string]any{"released": true, "previous": shown}, func(w io.Writer) {
		fmt.Fprintf(w, "released %s (was %s, attempts: %d)\n", key, shown.State, shown.Attempts)
	})
	return exitOK
}
