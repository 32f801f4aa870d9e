package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ForExample connects to the test server (DATABASE_URL, else LocalURL) in a
// fresh schema, for Example functions, which have no *testing.T: it panics
// when the server does not answer, which fails the example. cleanup closes
// the pool and drops the schema.
func ForExample() (pool *pgxpool.Pool, cleanup func()) {
	ctx := context.Background()
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		base = LocalURL
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		panic("dbtest: " + howTo + "\n" + err.Error())
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	u, err := WithSearchPath(base, schema)
	if err != nil {
		panic(err)
	}
	if pool, err = pgxpool.New(ctx, u); err != nil {
		panic(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		admin.Close(ctx)
	}
}
