// Package exampledb is how every example finds PostgreSQL: the one flag
// (-database-url), the one variable (DATABASE_URL) and the one local
// fallback (LocalURL), and what to say when nothing answers.
//
// It is an ordinary public package (it does not import testing), so a
// program copied from an example keeps building.
package exampledb

import (
	"context"
	"errors"
	"flag"
	"fmt"
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
	return fs.String(FlagName, Default(getenv), "PostgreSQL connection URL (default: $DATABASE_URL, else "+LocalURL+")")
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
