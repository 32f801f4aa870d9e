package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

func statsCommand() *command {
	return &command{
		name:     "stats",
		synopsis: "stats",
		summary:  "count keys by scope and state, the oldest in-flight key, and the outbox lag",
		about: `stats counts the keys of the inbox table by scope and state, with the live
leases among the in-flight keys and the age of the oldest in-flight key: an old
in-flight key with no live lease is a task that died and was never retried.
When the transactional outbox table (--outbox-table) exists, it also shows the
relay's lag: messages waiting to be published, the age of the oldest, and the
parked ones (given up on until an operator unparks them).
It reads the whole inbox; do not run it in a tight loop on a large one.`,
		flags: func(*flag.FlagSet) any { return nil },
		run:   runStats,
	}
}

// scopeStatsJSON is one row of stats.
type scopeStatsJSON struct {
	Scope             string       `json:"scope"`
	State             dedupe.State `json:"state"`
	Count             int64        `json:"count"`
	LiveLeases        int64        `json:"live_leases"`
	OldestInFlight    jsonTime     `json:"oldest_in_flight"`
	OldestInFlightAge string       `json:"oldest_in_flight_age,omitempty"`
}

// outboxJSON is the outbox's backlog.
type outboxJSON struct {
	Table   string `json:"table"`
	Pending int64  `json:"pending"`
	Parked  int64  `json:"parked"`
	// OldestPendingSeconds is the lag: the age of the oldest message not yet
	// published (0 when none waits).
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
}

// statsJSON is the whole output of stats.
type statsJSON struct {
	Table  string           `json:"table"`
	Total  int64            `json:"total"`
	Scopes []scopeStatsJSON `json:"scopes"`
	// Outbox is null when the outbox table does not exist.
	Outbox *outboxJSON `json:"outbox"`
}

func runStats(ctx context.Context, c *cli, _ any, args []string) int {
	if err := noArgs(args); err != nil {
		return c.fail("stats", err)
	}
	pool, inbox, err := c.connect(ctx, dedupe.Config{})
	if err != nil {
		return c.fail("stats", err)
	}
	defer pool.Close()
	stats, err := inbox.Stats(ctx)
	if err != nil {
		return c.fail("stats", err)
	}
	out := statsJSON{Table: inbox.Config().Table, Scopes: make([]scopeStatsJSON, 0, len(stats))}
	for _, s := range stats {
		row := scopeStatsJSON{Scope: s.Scope, State: s.State, Count: s.Count, LiveLeases: s.LiveLeases, OldestInFlight: jsonTime{s.OldestInFlight}}
		if !s.OldestInFlight.IsZero() {
			row.OldestInFlightAge = s.OldestInFlightAge.Round(time.Second).String()
		}
		out.Total += s.Count
		out.Scopes = append(out.Scopes, row)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: c.g.schema, Table: c.g.outboxTable})
	if err != nil {
		return c.fail("stats", err)
	}
	switch obs, err := ob.Stats(ctx); {
	case err == nil:
		out.Outbox = &outboxJSON{Table: ob.Config().Table, Pending: obs.Pending, Parked: obs.Parked,
			OldestPendingSeconds: obs.OldestPending.Seconds()}
	case errors.Is(err, dedupe.ErrNotMigrated):
		// No outbox here: the inbox is used without one.
	default:
		return c.fail("stats", err)
	}
	c.emit(c.stdout, out, func(w io.Writer) {
		fmt.Fprintln(w, "SCOPE\tSTATE\tCOUNT\tLIVE LEASES\tOLDEST IN FLIGHT")
		for _, r := range out.Scopes {
			oldest := "-"
			if r.OldestInFlightAge != "" {
				oldest = r.OldestInFlightAge + " ago"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", r.Scope, r.State, r.Count, r.LiveLeases, oldest)
		}
		fmt.Fprintf(w, "total\t\t%d\t\t\n", out.Total)
		if o := out.Outbox; o != nil {
			lag := time.Duration(o.OldestPendingSeconds * float64(time.Second)).Round(time.Millisecond)
			if o.Pending == 0 {
				fmt.Fprintf(w, "\noutbox %s: nothing pending, %d parked\n", o.Table, o.Parked)
			} else {
				fmt.Fprintf(w, "\noutbox %s: %d pending (oldest %s ago), %d parked\n", o.Table, o.Pending, lag, o.Parked)
			}
		} else {
			fmt.Fprintf(w, "\noutbox %s: no such table\n", ob.Config().Table)
		}
	})
	return exitOK
}
