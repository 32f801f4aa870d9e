package dbtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// ProxyPool returns a pool to the server of url whose connections pass
// through a PostgreSQL-protocol proxy applying policy, and the proxy; both
// close when the test ends.
func ProxyPool(t testing.TB, url string, policy pgproxy.Policy) (*pgxpool.Pool, *pgproxy.Proxy) {
	t.Helper()
	u, p := ProxyURL(t, url, policy)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// ProxyURL starts a PostgreSQL-protocol proxy applying policy in front of
// the server of url and returns url through it, for clients other than a
// pgx pool (database/sql); the proxy closes when the test ends.
func ProxyURL(t testing.TB, url string, policy pgproxy.Policy) (string, *pgproxy.Proxy) {
	t.Helper()
	host, err := pgproxy.Host(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgproxy.Start(host, policy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u, err := p.URL(url)
	if err != nil {
		t.Fatal(err)
	}
	return u, p
}
