package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/examples/exampledb"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestShipsEachOrderOnce runs the example: 30 orders, each published twice
// to two routers, one failed attempt; exactly 30 shipments. The run's
// schema is dropped at the end, or kept with its shipments when asked.
func TestShipsEachOrderOnce(t *testing.T) {
	ctx := context.Background()
	url := dbtest.BaseURL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, keep := range []bool{false, true} {
		o := options{URL: url, Orders: 30, Schema: exampledb.SchemaName("watermill-router"), KeepSchema: keep}
		var out bytes.Buffer
		shipped, err := run(ctx, o, &out)
		if err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		t.Log(out.String())
		if shipped != 30 || !strings.Contains(out.String(), "shipped: 30, duplicates absorbed: 90, failed attempts retried: 1") {
			t.Fatalf("shipped %d; report:\n%s", shipped, out.String())
		}
		var n int
		err = conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{o.Schema, "watermill_shipments"}.Sanitize()).Scan(&n)
		switch {
		case keep && (err != nil || n != 30):
			t.Fatalf("-keep-schema: shipments in %s = %d, %v; want 30", o.Schema, n, err)
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
