package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestShipsEachOrderOnce runs the example: 30 orders, each published twice
// to two routers, one failed attempt; exactly 30 shipments.
func TestShipsEachOrderOnce(t *testing.T) {
	db := dbtest.New(t)
	var out bytes.Buffer
	if err := run(context.Background(), db.URL, 30, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	if !strings.Contains(out.String(), "shipped: 30, duplicates absorbed: 90, failed attempts retried: 1") {
		t.Fatalf("report:\n%s", out.String())
	}
	if n := db.Count(t, "SELECT count(*) FROM watermill_shipments"); n != 30 {
		t.Fatalf("shipments = %d, want 30", n)
	}
}
