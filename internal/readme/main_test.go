//go:build unix

package readme

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rogpeppe/go-internal/testscript"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// scriptTimeout bounds one script when the test has no deadline of its own
// (go test -timeout 0); each command of a script is bounded by it.
const scriptTimeout = 8 * time.Minute

// deadline is when the scripts of t must end: the test's deadline less a
// margin for reporting, or scriptTimeout from now.
func deadline(t *testing.T) time.Time {
	if d, ok := t.Deadline(); ok {
		return d.Add(-30 * time.Second)
	}
	return time.Now().Add(scriptTimeout)
}

// repoRoot is the directory of the repository's go.work, found from the
// test's working directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/exactlyonce/dedupe\n")) {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("readme: the repository root (go.work beside the core's go.mod) is not above the working directory")
		}
		dir = parent
	}
}

// goEnvNames are the go command's settings the scripts inherit, so that a
// "go build" in a script uses the same caches, proxy and toolchain as the
// test run.
var goEnvNames = []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOPROXY", "GOSUMDB", "GONOSUMDB", "GOPRIVATE",
	"GONOPROXY", "GOINSECURE", "GOFLAGS", "GOTOOLCHAIN", "CGO_ENABLED"}

var (
	goEnvOnce sync.Once
	goEnv     []string
	goEnvErr  error
)

// goEnvVars returns NAME=value for goEnvNames, as "go env" reports them,
// with -trimpath added to GOFLAGS.
func goEnvVars(t *testing.T) []string {
	t.Helper()
	goEnvOnce.Do(func() {
		out, err := exec.Command("go", append([]string{"env", "-json"}, goEnvNames...)...).Output()
		if err != nil {
			goEnvErr = fmt.Errorf("go env: %w", err)
			return
		}
		var m map[string]string
		if goEnvErr = json.Unmarshal(out, &m); goEnvErr != nil {
			return
		}
		// -trimpath keeps each package's directory out of its build cache
		// key, so the scripts' copies of the repository, each in a
		// directory of its own, share one compilation of the repository's
		// packages instead of compiling them again per copy.
		m["GOFLAGS"] = strings.TrimSpace(m["GOFLAGS"] + " -trimpath")
		for _, name := range goEnvNames {
			if m[name] != "" {
				goEnv = append(goEnv, name+"="+m[name])
			}
		}
	})
	if goEnvErr != nil {
		t.Fatalf("readme: %v", goEnvErr)
	}
	return goEnv
}

// buildCLI builds cmd/dedupe into a directory of t's, for the scripts'
// PATH, and returns the directory.
func buildCLI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/dedupe")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("readme: go build ./cmd/dedupe: %v\n%s", err, out)
	}
	return dir
}

// schemaURL creates a throwaway schema on the test server, drops it when
// the script ends, and returns a URL whose connections use it.
func schemaURL(env *testscript.Env, base string) (string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "readme_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", err
	}
	env.Defer(func() {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			env.T().Log("drop schema", schema, err)
			return
		}
		defer c.Close(ctx)
		// A program a script started may still hold connections.
		_, _ = c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND query ILIKE '%'||$1||'%'`, schema)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			env.T().Log("drop schema", schema, err)
		}
	})
	return dbtest.WithSearchPath(base, schema)
}

// freeAddr returns a loopback address that nothing listened on a moment
// ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// setenv sets NAME=value pairs in env.
func setenv(env *testscript.Env, pairs ...string) error {
	for _, kv := range pairs {
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			return errors.New("setenv: " + kv)
		}
		env.Setenv(name, value)
	}
	return nil
}
