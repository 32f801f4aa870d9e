package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
)

// The operator's round trip: create the table, run a task once per key,
// look at what it stored. Compiled, not run: it needs DATABASE_URL.
func Example() {
	ctx := context.Background()
	db := []string{"--database-url", os.Getenv("DATABASE_URL")}
	run(ctx, append(db, "migrate", "up"), os.Stdout, os.Stderr)
	// The first run runs the command; every later run of the same key exits
	// 0 without running it.
	for range 2 {
		code := run(ctx, append(db, "run", "--scope", "cron", "--key", "backup-2026-01-01", "--", "echo", "backed up"),
			os.Stdout, os.Stderr)
		fmt.Println("exit", code)
	}
	run(ctx, append(db, "inspect", "--scope", "cron", "--key", "backup-2026-01-01"), os.Stdout, os.Stderr)
	run(ctx, append(db, "--json", "stats"), os.Stdout, os.Stderr)
	run(ctx, append(db, "purge", "--older-than", "24h"), os.Stdout, os.Stderr)
}

// migrate sql prints the schema for other migration tools; it needs no
// database.
func Example_migrateSQL() {
	var out bytes.Buffer
	code := run(context.Background(), []string{"migrate", "sql", "--table", "jobs_inbox"}, &out, os.Stderr)
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "CREATE TABLE") && strings.Contains(line, "jobs_inbox") {
			fmt.Println(line)
		}
	}
	fmt.Println("exit", code)
	// Output:
	// CREATE TABLE IF NOT EXISTS "jobs_inbox" (
	// exit 0
}

// A run without a command is a usage error, reported before anything is
// claimed.
func Example_runUsage() {
	code := run(context.Background(), []string{"run", "--scope", "cron", "--key", "k"}, os.Stdout, os.Stdout)
	fmt.Println("exit", code)
	// Output:
	// dedupe run: no command: dedupe run --scope S --key K -- CMD [ARGS...]
	// exit 2
}
