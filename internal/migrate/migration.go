// Package migrate is the machinery behind the root's Migrate and Migrator:
// the embedded migrations rendered for a schema and table names, the
// versions recorded per line and table, the advisory lock that lets many
// processes migrate at once, and the application of migrations up and down.
// The root keeps the public types and the embedded files (an embed reaches
// only its own package's directory) and passes them in.
package migrate

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The lines the templates know (the root's LineInbox and LineOutbox).
const (
	LineInbox  = "inbox"
	LineOutbox = "outbox"
)

// Migration is one versioned step of a line, rendered for some Names.
type Migration struct {
	Line    string
	Version int
	Name    string
	Up      string
	Down    string
}

// Names are the schema and tables the migrations are rendered for.
type Names struct {
	Schema      string // "" for the connection's search_path
	InboxTable  string
	OutboxTable string
}

// TableOf is the table a line's versions are recorded under.
func (n Names) TableOf(line string) string {
	if line == LineOutbox {
		return n.OutboxTable
	}
	return n.InboxTable
}

// qualify returns the quoted, optionally schema-qualified name.
func (n Names) qualify(name string) string {
	if n.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{n.Schema, name}.Sanitize()
}

// Querier is dedupe.Querier: what runs a statement.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// InTx runs f in a transaction and commits it when f returns nil (the
// root's inTx over its driver).
type InTx func(ctx context.Context, f func(tx Querier) error) error
