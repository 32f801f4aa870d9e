package main

import (
	"context"
	"os"
	"testing"
)

// TestRunChargesEachOrderOnce runs the example: every order delivered four
// times at the same instant, through database/sql, is charged once.
func TestRunChargesEachOrderOnce(t *testing.T) {
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		base = localURL
	}
	rep, err := run(context.Background(), base, 40, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ok() || rep.claimed != 40 || rep.duplicates != 120 {
		t.Fatalf("report = %+v; want 40 charges of 40 orders, 40 claimed, 120 duplicates", rep)
	}
}
