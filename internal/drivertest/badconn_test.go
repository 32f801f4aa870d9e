package drivertest_test

import (
	"context"
	"database/sql"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// TestBadConnectionAtBeginIsReplaced: a pooled connection that breaks at
// BEGIN (the fault proxy cuts it there, before the server sees the BEGIN)
// is what lib/pq reports as driver.ErrBadConn, and database/sql's
// (*sql.DB).BeginTx then begins on another connection. A consumer's
// transaction must get the same: over database/sql it begins on a *sql.Conn
// of its own, whose BeginTx does not try another connection by itself. The
// first message of an inbox is the one at risk: it takes that path before
// the driver is known.
func TestBadConnectionAtBeginIsReplaced(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	var cut atomic.Bool
	url := startProxy(t, db.URL, func(ev pgproxy.Event) pgproxy.Action {
		if ev.Runs && strings.HasPrefix(strings.ToUpper(strings.TrimSpace(ev.Query)), "BEGIN") && cut.CompareAndSwap(false, true) {
			return pgproxy.Cut
		}
		return pgproxy.Forward
	})
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	sdb, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sdb.Close() })
	sdb.SetMaxOpenConns(1) // the one pooled connection is the one cut at BEGIN
	ctx := context.Background()
	if err := sdb.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	inbox, err := dedupe.New(dedupe.SQL(sdb), dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{
		Scope: "s", Key: func(m string) (string, error) { return m, nil },
	}, func(context.Context, *sql.Tx, string) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	o, err := c.Handle(ctx, "k")
	if !cut.Load() {
		t.Fatal("the proxy saw no BEGIN to cut")
	}
	if err != nil || o != dedupe.OutcomeClaimed {
		t.Fatalf("first Handle after its pooled connection broke at BEGIN: %v, %v; want it claimed on a new connection", o, err)
	}
}
