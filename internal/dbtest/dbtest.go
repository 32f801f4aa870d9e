// Package dbtest gives every test its own PostgreSQL schema on a real server.
//
// The server is found, in order, through DATABASE_URL, at 127.0.0.1:5432
// (database test, trust auth), or by starting a container with
// testcontainers where a Docker engine runs. When none answers the test fails
// with instructions; it never passes by skipping.
package dbtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LocalURL is where the tests look when DATABASE_URL is not set.
const LocalURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

const howTo = `no PostgreSQL server for the tests. Provide one of:
  - DATABASE_URL=postgres://user:pass@host:5432/db (any database the user may CREATE SCHEMA in)
  - a server on 127.0.0.1:5432 with database "test" and trust auth for user postgres
  - a running Docker engine, so that testcontainers can start postgres:16-alpine
    (internal/pgcontainer, run with go run from the repository)`

var (
	baseOnce sync.Once
	baseURL  string
	baseErr  error
)

// BaseURL returns the connection string of the server the tests use.
func BaseURL(t testing.TB) string {
	t.Helper()
	baseOnce.Do(func() { baseURL, baseErr = findServer() })
	if baseErr != nil {
		t.Fatalf("dbtest: %v", baseErr)
	}
	return baseURL
}

func findServer() (string, error) {
	var tried []string
	if u := os.Getenv("DATABASE_URL"); u != "" {
		if err := ping(u); err != nil {
			return "", fmt.Errorf("DATABASE_URL does not answer: %w\n%s", err, howTo)
		}
		return u, nil
	}
	if err := ping(LocalURL); err == nil {
		return LocalURL, nil
	} else {
		tried = append(tried, fmt.Sprintf("%s: %v", LocalURL, err))
	}
	u, err := startContainer()
	if err == nil {
		return u, nil
	}
	tried = append(tried, fmt.Sprintf("testcontainers: %v", err))
	return "", fmt.Errorf("%s\ntried:\n  %s", howTo, strings.Join(tried, "\n  "))
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

// startContainer runs the pgcontainer tool (its own module, so that
// testcontainers stays out of the core's dependencies), which starts a
// PostgreSQL container and prints its URL; the tool keeps the container
// until this process ends and its standard input closes.
func startContainer() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "run", "./internal/pgcontainer")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // held open for the life of the process
	if err != nil {
		return "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Wait()
		return "", fmt.Errorf("pgcontainer: %w", err)
	}
	containerStdin = stdin
	return strings.TrimSpace(line), nil
}

// containerStdin keeps the pgcontainer tool, and so its container, alive.
var containerStdin io.WriteCloser

// moduleRoot finds the repository's root module (its go.mod names the
// core module) from this process's working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/exactlyonce/dedupe\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("the repository's root module was not found above the working directory")
		}
		dir = parent
	}
}

// DB is one test's private schema.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	// URL connects to the schema (search_path set), for subprocesses and
	// for pools a test builds itself.
	URL string
}

// Options tune New.
type Options struct {
	MaxConns int32 // Defaults to 8.
}

// New creates a fresh schema, returns a pool whose connections use it, and
// drops the schema when the test ends.
func New(t testing.TB, opts ...Options) *DB {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.MaxConns == 0 {
		o.MaxConns = 8
	}
	base := BaseURL(t)
	ctx := context.Background()

	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close(ctx)
		t.Fatalf("dbtest: create schema: %v", err)
	}
	admin.Close(ctx)

	su, err := WithSearchPath(base, schema)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(su)
	if err != nil {
		t.Fatalf("dbtest: parse url: %v", err)
	}
	cfg.MaxConns = o.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("dbtest: pool: %v", err)
	}
	t.Cleanup(func() {
		// pgxpool's Close waits for every acquired connection: one that
		// the code under test leaked would hang the test binary until its
		// timeout. A leak fails the test instead, with the pool left open.
		if n := SettledAcquired(pool); n > 0 {
			t.Errorf("dbtest: %d connections of the pool are still acquired after the test: leaked (the pool is left open)", n)
		} else {
			pool.Close()
		}
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("dbtest: drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		// Connections of subprocesses may still linger; end them first.
		_, _ = c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND query ILIKE '%'||$1||'%'`, schema)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("dbtest: drop schema %s: %v", schema, err)
		}
	})
	return &DB{Pool: pool, Schema: schema, URL: su}
}

// SettledAcquired returns how many of pool's connections stay acquired: 0
// as soon as none is, else the count once it has not changed for leakWait.
// A count read at once can be above the truth: pgxpool destroys a broken
// connection, or one released inside a transaction, in a goroutine of its
// own (puddle's Resource.Destroy), and counts it acquired until that is
// done; a goroutine of the test may also still be handing one back. A
// leaked connection never goes back, so it is still counted after leakWait.
func SettledAcquired(pool *pgxpool.Pool) int32 {
	const leakWait = 10 * time.Second
	last, since := int32(-1), time.Now()
	for {
		n := pool.Stat().AcquiredConns()
		switch {
		case n == 0:
			return 0
		case n != last:
			last, since = n, time.Now()
		case time.Since(since) > leakWait:
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WithSearchPath returns u with its search_path set to schema.
func WithSearchPath(u, schema string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme == "" {
		// A key=value DSN.
		return u + " search_path=" + schema, nil
	}
	q := parsed.Query()
	q.Set("search_path", schema)
	parsed.RawQuery = q.Encode()
	return parsed.String(), nil
}

// BackendPIDs returns the server process ids of the connections whose
// application_name is appName, for fault injection with Terminate.
func (d *DB) BackendPIDs(t testing.TB, appName string) []uint32 {
	t.Helper()
	rows, err := d.Pool.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, appName)
	if err != nil {
		t.Fatalf("dbtest: list backends: %v", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		t.Fatalf("dbtest: list backends: %v", err)
	}
	return pids
}

// Terminate kills the server process pid with pg_terminate_backend, as a
// crashed connection would end.
func (d *DB) Terminate(t testing.TB, pid uint32) {
	t.Helper()
	var ok bool
	if err := d.Pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil {
		t.Fatalf("dbtest: terminate %d: %v", pid, err)
	}
}

// Count runs a SELECT count(*) style query returning one integer.
func (d *DB) Count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := d.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("dbtest: %s: %v", sql, err)
	}
	return n
}

// Exec runs sql and fails the test on error.
func (d *DB) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := d.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("dbtest: %s: %v", sql, err)
	}
}

// VerifyTestMain runs the package's tests and then fails if goroutines
// leaked. It keeps the
// library quiet: records logged through slog.Default are held in memory and
// printed only when the package fails (with -v they go to stderr at once);
// tests that want their logs beside their own output use Logger(t).
func VerifyTestMain(m *testing.M) {
	quietDefaultLogger()
	code := m.Run()
	if code == 0 {
		if err := checkLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: %v\n", err)
			code = 1
		}
	}
	if code != 0 {
		heldLog.dump(os.Stderr)
	}
	os.Exit(code)
}
