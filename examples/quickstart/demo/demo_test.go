package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestQuickstart runs the quickstart's whole program logic with a small
// batch against the test database and checks its Report and its cleanup.
func TestQuickstart(t *testing.T) {
	url := dbtest.BaseURL(t)
	rep, err := Run(context.Background(), Options{
		Orders: 60, DupRate: 0.5, FailRate: 0.2, Consumers: 3, Workers: 2, CrashOne: true,
		DatabaseURL: url, DatabaseSource: "test", Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if rep.Unique != 60 || rep.Published != 90 {
		t.Fatalf("unique = %d, published = %d; want 60 and 90", rep.Unique, rep.Published)
	}
	if !rep.OK() || rep.Effects != 60 {
		t.Fatalf("effects = %d (distinct %d), want 60", rep.Effects, rep.DistinctEffects)
	}
	if rep.Duplicates < rep.Published-rep.Unique {
		t.Fatalf("duplicates absorbed = %d, want at least the %d copies", rep.Duplicates, rep.Published-rep.Unique)
	}
	if rep.Retries == 0 || rep.Deliveries < rep.Published+rep.Retries {
		t.Fatalf("deliveries = %d, retries = %d: the failing first attempts were not redelivered", rep.Deliveries, rep.Retries)
	}
	var out bytes.Buffer
	rep.Print(&out)
	if !strings.Contains(out.String(), "exactly once") {
		t.Fatalf("Report does not say exactly once:\n%s", out.String())
	}

	// The quickstart's schema is gone.
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(),
		"SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1", rep.Schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("schema %s left behind", rep.Schema)
	}
}

func TestReportFlagsMismatch(t *testing.T) {
	rep := &Report{Unique: 10, Published: 12, Deliveries: 12, Effects: 11, DistinctEffects: 10, Crashed: -1}
	if rep.OK() {
		t.Fatal("a Report with 11 effects for 10 orders must not be ok")
	}
	var out bytes.Buffer
	rep.Print(&out)
	if !strings.Contains(out.String(), "MISMATCH") {
		t.Fatalf("Report hides the mismatch:\n%s", out.String())
	}
}
