package dbtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AppPool returns a pool on the test's schema whose connections carry
// application_name app, so that BackendPIDs(t, app) finds exactly them for
// Terminate: the victim pool of a killed-connection test. maxConns 0 keeps
// pgxpool's default. The pool is closed when the test ends.
func (d *DB) AppPool(t testing.TB, app string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatalf("dbtest: parse url: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dbtest: pool %s: %v", app, err)
	}
	t.Cleanup(pool.Close)
	return pool
}
