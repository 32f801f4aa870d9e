package dedupetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// LocalURL is where the kit looks when DATABASE_URL is not set.
const LocalURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

const howTo = `dedupetest: no PostgreSQL server for the tests. Provide one of:
  - DATABASE_URL=postgres://user:pass@host:5432/db (any database the user may CREATE SCHEMA in)
  - a server on 127.0.0.1:5432 with database "test" and trust auth for user postgres
  - a running Docker engine, so that testcontainers can start postgres:16-alpine`

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
)

// ServerURL returns the connection string of the server the kit uses,
// starting a container the first time if it must. The test fails, never
// skips, when none answers.
func ServerURL(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() { serverURL, serverErr = findServer() })
	if serverErr != nil {
		t.Fatal(serverErr)
	}
	return serverURL
}

func findServer() (string, error) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		if err := ping(u); err != nil {
			return "", fmt.Errorf("DATABASE_URL does not answer: %w\n%s", err, howTo)
		}
		return u, nil
	}
	localErr := ping(LocalURL)
	if localErr == nil {
		return LocalURL, nil
	}
	u, err := startContainer()
	if err == nil {
		return u, nil
	}
	return "", fmt.Errorf("%s\ntried:\n  %s: %v\n  testcontainers: %v", howTo, LocalURL, localErr, err)
}

func ping(u string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// startContainer starts postgres:16-alpine; testcontainers' reaper removes
// it when the test process exits.
func startContainer() (u string, err error) {
	defer func() {
		if v := recover(); v != nil { // testcontainers panics in some setups without Docker
			err = fmt.Errorf("testcontainers: %v", v)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
		tcpostgres.WithDatabase("test"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return "", err
	}
	return c.ConnectionString(ctx, "sslmode=disable")
}

// schema creates a fresh schema for t, dropped when the test ends, and
// returns its name and a URL whose connections use it.
func schema(t testing.TB, base string) (string, string) {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "dt_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("dedupetest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("dedupetest: create schema: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("dedupetest: drop schema %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+name+" CASCADE"); err != nil {
			t.Logf("dedupetest: drop schema %s: %v", name, err)
		}
	})
	return name, withSearchPath(base, name)
}

// withSearchPath returns u with its search_path set to schema.
func withSearchPath(u, schema string) string {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme == "" {
		return strings.TrimSpace(u) + " search_path=" + schema // a key=value DSN
	}
	q := parsed.Query()
	q.Set("search_path", schema)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// newPool opens a pool on u, closed when the test ends.
func newPool(t testing.TB, u string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("dedupetest: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dedupetest: pool: %v", err)
	}
	t.Cleanup(func() { closePool(t, pool) })
	return pool
}

// closePool closes pool, waiting at most DefaultTimeout: pgxpool's Close
// waits for every acquired connection, and a handler that hangs holding one
// (see Deliver) must not hang the test's cleanup as well.
func closePool(t testing.TB, pool *pgxpool.Pool) {
	done := make(chan struct{})
	go func() {
		pool.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(DefaultTimeout):
		t.Errorf("dedupetest: the pool did not close within %s: a handler still holds a connection (%s)", DefaultTimeout, stuckCause)
	}
}
