package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/exactlyonce/dedupe"
)

func migrateCommand() *command {
	return &command{
		name:     "migrate",
		synopsis: "migrate [up | status | sql]",
		summary:  "create or upgrade the inbox and outbox tables (up), list migrations (status), print the SQL (sql)",
		about: `migrate up applies the pending migrations of the inbox table named by
--schema and --table (and of the outbox table, --outbox-table), under an
advisory lock, so that many processes may run it at once. migrate status lists every migration and when it was applied.
migrate sql prints the schema as one plain SQL script (no database needed), for
goose, golang-migrate or atlas. Without an argument, migrate runs up.`,
		flags: func(*flag.FlagSet) any { return nil },
		run:   runMigrate,
	}
}

// migrationJSON is one row of "migrate status --json".
type migrationJSON struct {
	Line      string   `json:"line"`
	Version   int      `json:"version"`
	Name      string   `json:"name"`
	Applied   bool     `json:"applied"`
	AppliedAt jsonTime `json:"applied_at"`
}

func runMigrate(ctx context.Context, c *cli, _ any, args []string) int {
	action := "up"
	if len(args) > 0 {
		action = args[0]
	}
	if len(args) > 1 {
		return c.fail("migrate", usagef("unexpected argument %q", args[1]))
	}
	cfg := dedupe.MigrateConfig{Schema: c.g.schema, InboxTable: c.g.table, OutboxTable: c.g.outboxTable}
	switch action {
	case "up", "status":
	case "sql":
		script, err := dedupe.PlainSQL(cfg)
		if err != nil {
			return c.fail("migrate", err)
		}
		fmt.Fprint(c.stdout, script)
		return exitOK
	default:
		return c.fail("migrate", usagef("unknown action %q (want up, status or sql)", action))
	}
	pool, inbox, err := c.connect(ctx, dedupe.Config{})
	if err != nil {
		return c.fail("migrate", err)
	}
	defer pool.Close()
	m, err := dedupe.NewMigrator(pool, cfg)
	if err != nil {
		return c.fail("migrate", err)
	}
	if action == "up" {
		migs, err := m.Up(ctx)
		if err != nil {
			return c.fail("migrate", err)
		}
		applied := make([]string, 0, len(migs))
		for _, mig := range migs {
			applied = append(applied, fmt.Sprintf("%s/%03d_%s", mig.Line, mig.Version, mig.Name))
		}
		c.emit(c.stdout, map[string]any{"table": inbox.Config().Table, "applied": applied}, func(w io.Writer) {
			if len(applied) == 0 {
				fmt.Fprintf(w, "%s is up to date\n", inbox.Config().Table)
				return
			}
			for _, a := range applied {
				fmt.Fprintf(w, "applied migration %s\n", a)
			}
		})
		return exitOK
	}
	status, err := m.Status(ctx)
	if err != nil {
		return c.fail("migrate", err)
	}
	rows := make([]migrationJSON, 0, len(status))
	pending := 0
	for _, s := range status {
		rows = append(rows, migrationJSON{Line: string(s.Line), Version: s.Version, Name: s.Name, Applied: s.Applied, AppliedAt: jsonTime{s.AppliedAt}})
		if !s.Applied {
			pending++
		}
	}
	c.emit(c.stdout, map[string]any{"table": inbox.Config().Table, "migrations": rows, "pending": pending}, func(w io.Writer) {
		fmt.Fprintln(w, "LINE\tVERSION\tNAME\tAPPLIED AT")
		for _, r := range rows {
			at := "pending"
			if r.Applied {
				at = r.AppliedAt.text()
			}
			fmt.Fprintf(w, "%s\t%03d\t%s\t%s\n", r.Line, r.Version, r.Name, at)
		}
	})
	return exitOK
}
