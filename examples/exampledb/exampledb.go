package exampledb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// LocalURL is the PostgreSQL every example (and the dedupe CLI) uses when
// neither -database-url nor DATABASE_URL names one: a local server with
// trust authentication and a database named test.
const LocalURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// FlagName is the database flag of every example and command.
const FlagName = "database-url"

// Default returns getenv("DATABASE_URL"), else LocalURL.
func Default(getenv func(string) string) string {
	if u := getenv("DATABASE_URL"); u != "" {
		return u
	}
	return LocalURL
}

// Flag defines -database-url on fs, its default Default(getenv).
func Flag(fs *flag.FlagSet, getenv func(string) string) *string {
	return fs.String(FlagName, Default(getenv), "PostgreSQL connection `URL` ($DATABASE_URL when set, else the local server)")
}

// HowToProvide says how to give an example a PostgreSQL server.
const HowToProvide = `the example needs PostgreSQL (13 or newer). Provide one of:
  - DATABASE_URL=postgres://user:pass@host:5432/db (or -database-url), a user that may create tables
  - a server on 127.0.0.1:5432 with a database "test" and trust auth for user postgres, e.g.
      docker run -d --name dedupe-pg -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust -e POSTGRES_DB=test postgres:16-alpine`

// ErrUnreachable is wrapped by Check's error when PostgreSQL does not
// answer.
var ErrUnreachable = errors.New("PostgreSQL does not answer")

// Check connects to url and pings it within 5 seconds. Its error names the
// URL (without its password), wraps ErrUnreachable and the cause, and says
// how to provide a server.
func Check(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		err = conn.Ping(ctx)
		_ = conn.Close(ctx)
	}
	if err != nil {
		return fmt.Errorf("%w at %s:%d (database %s): %w\n%s", ErrUnreachable, cfg.Host, cfg.Port, cfg.Database, err, HowToProvide)
	}
	return nil
}

// Source describes url for a report: "127.0.0.1:5432" for LocalURL,
// else "DATABASE_URL" or "-database-url" by where it came from.
func Source(url string, getenv func(string) string) string {
	switch url {
	case LocalURL:
		return "127.0.0.1:5432"
	case getenv("DATABASE_URL"):
		return "DATABASE_URL"
	}
	return "-" + FlagName
}

// KeepSchemaFlag is the flag with which a demo that runs and exits keeps
// its schema and tables at exit, to look at them; by default it drops them.
const KeepSchemaFlag = "keep-schema"

// KeepSchemaVar defines -keep-schema on fs, stored in p.
func KeepSchemaVar(fs *flag.FlagSet, p *bool) {
	fs.BoolVar(p, KeepSchemaFlag, false, "keep the schema and its tables at exit (default: drop them)")
}

// SchemaName returns a fresh name for the schema of one run of the demo
// named example: "dedupe_", the example's name (dashes as underscores),
// "_" and 8 random hex digits, e.g. dedupe_watermill_router_1f0c9a2b.
func SchemaName(example string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "dedupe_" + strings.ReplaceAll(example, "-", "_") + "_" + hex.EncodeToString(b)
}

// InSchema returns the URL u (postgres://...) with its search_path set to
// schema, so that every connection opened from it works there.
func InSchema(u, schema string) (string, error) {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") {
		return "", errors.New("database URL: want postgres://... (not shown; it may hold a password)")
	}
	q := p.Query()
	q.Set("search_path", schema)
	p.RawQuery = q.Encode()
	return p.String(), nil
}
