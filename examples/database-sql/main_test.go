package main

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/examples/exampledb"
)

// TestRunChargesEachOrderOnce runs the example: every order delivered four
// times at the same instant, through database/sql, is charged once; the
// run's schema is dropped at the end, or kept with its charges when asked.
func TestRunChargesEachOrderOnce(t *testing.T) {
	ctx := context.Background()
	url := exampledb.Default(os.Getenv)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, keep := range []bool{false, true} {
		o := options{URL: url, Orders: 40, Copies: 4, Schema: exampledb.SchemaName("database-sql"), KeepSchema: keep}
		rep, err := run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.ok() || rep.claimed != 40 || rep.duplicates != 120 {
			t.Fatalf("report = %+v; want 40 charges of 40 orders, 40 claimed, 120 duplicates", rep)
		}
		var charges int
		err = conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{o.Schema, "charges"}.Sanitize()).Scan(&charges)
		switch {
		case keep && (err != nil || charges != 40):
			t.Fatalf("-keep-schema: charges in %s = %d, %v; want 40", o.Schema, charges, err)
		case !keep && err == nil:
			t.Fatalf("schema %s still there after the run", o.Schema)
		}
		if keep {
			if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{o.Schema}.Sanitize()+" CASCADE"); err != nil {
				t.Fatal(err)
			}
		}
	}
}
