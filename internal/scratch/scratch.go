// Package scratch gives the programs that measure dedupe against a database
// they are handed (cmd/soak, cmd/bench) a private schema in it: a fresh
// name, its creation and its drop, and where to find the database when no
// -dsn is given.
package scratch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LocalDSN is where the programs look when neither -dsn nor DATABASE_URL is
// set.
const LocalDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns dsn, else $DATABASE_URL, else LocalDSN.
func DSN(dsn string) string {
	if dsn == "" {
		dsn = os.Getenv("DATABASE_URL")
	}
	if dsn == "" {
		dsn = LocalDSN
	}
	return dsn
}

// Name returns a schema name no other run uses: prefix, "_" and 12 random
// hex digits.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// Execer is a *pgx.Conn or a *pgxpool.Pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Create creates the schema.
func Create(ctx context.Context, db Execer, schema string) error {
	_, err := db.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	return err
}

// Drop drops the schema and everything in it.
func Drop(ctx context.Context, db Execer, schema string) error {
	_, err := db.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	return err
}
