package sqldb

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestSQLBeginPanicInBatch: a panic in a statement's callback behind BEGIN
// (the core's own, or pgx's tracer in the user's config) reaches Begin's
// caller, and neither the transaction nor its connection stays open. Over
// pgx's stdlib the statements run inside (*sql.Conn).Raw, which on a panic
// closes the *sql.Conn and so waits for the *sql.Tx begun on it to end: Begin
// would hang, holding the claim's row lock, until its context ended. The
// one-by-one path (other drivers) leaked the connection instead.
func TestSQLBeginPanicInBatch(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	for _, tc := range []struct {
		name   string
		notPgx bool // false: pipelined through pgx's stdlib; true: as for another driver
	}{{"pipelined", false}, {"one by one", true}} {
		t.Run(tc.name, func(t *testing.T) {
			sdb, err := sql.Open("pgx", db.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer sdb.Close()
			d := NewDriver(sdb, "COMMIT", "SELECT 1", ErrNoTx)
			d.notPgx.Store(tc.notPgx)
			// The test's context never ends: a begin that waits for it
			// hangs, and the test binary's timeout reports it.
			ctx := context.Background()
			b := &pgx.Batch{}
			b.Queue("SELECT 1").QueryRow(func(pgx.Row) error { panic("callback") })
			got := func() (v any) {
				defer func() { v = recover() }()
				tx, err := d.Begin(ctx, pgx.TxOptions{}, b)
				if err == nil {
					_ = tx.Rollback(ctx)
				}
				return nil
			}()
			if got != "callback" {
				t.Fatalf("begin: recovered %v, want the callback's panic", got)
			}
			if n := sdb.Stats().InUse; n != 0 {
				t.Fatalf("%d connections in use after begin panicked: its transaction stayed open", n)
			}
		})
	}
}
