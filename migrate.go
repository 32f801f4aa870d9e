package dedupe

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"time"

	"github.com/exactlyonce/dedupe/internal/migrate"
)

//go:embed migrations/*/*.sql
var migrationFS embed.FS

// Line is one kind of table with its own numbered migrations
// (migrations/<line>/NNN_name.up.sql and .down.sql), versioned per table, so
// that an inbox used alone (an HTTP key table, say) never creates an outbox.
type Line string

// The migration lines.
const (
	// LineInbox creates the inbox table, Config.Table (MigrateConfig.InboxTable).
	LineInbox Line = "inbox"
	// LineOutbox creates the transactional outbox table, outbox.Config.Table.
	LineOutbox Line = "outbox"
)

// AllLines returns every migration line, in the order they are applied.
func AllLines() []Line { return []Line{LineInbox, LineOutbox} }

// DefaultOutboxTable is the default of MigrateConfig.OutboxTable and of
// outbox.Config.Table.
const DefaultOutboxTable = "dedupe_outbox"

// MigrateConfig says which tables Migrate creates and upgrades. The zero
// value is usable: both lines, default names, the connection's search_path.
type MigrateConfig struct {
	// Schema holds the tables (created if missing). Defaults to "" (the
	// connection's search_path).
	Schema string
	// InboxTable is the inbox table (Config.Table). Defaults to
	// "dedupe_inbox".
	InboxTable string
	// OutboxTable is the outbox table (outbox.Config.Table). Defaults to
	// "dedupe_outbox".
	OutboxTable string
	// Lines are the lines to migrate. Defaults to AllLines().
	Lines []Line
}

// withDefaults returns a copy of c with every zero field defaulted, or a
// *ConfigError.
func (c MigrateConfig) withDefaults() (MigrateConfig, error) {
	if c.InboxTable == "" {
		c.InboxTable = DefaultTable
	}
	if c.OutboxTable == "" {
		c.OutboxTable = DefaultOutboxTable
	}
	if len(c.Lines) == 0 {
		c.Lines = AllLines()
	} else {
		lines := make([]Line, 0, len(c.Lines))
		for _, l := range c.Lines {
			if !slices.Contains(lines, l) {
				lines = append(lines, l) // a line named twice is migrated once
			}
		}
		c.Lines = lines
	}
	switch {
	case len(c.InboxTable) > 55:
		return c, &ConfigError{Field: "InboxTable", Reason: "must be at most 55 bytes (PostgreSQL truncates longer names)"}
	case len(c.OutboxTable) > 48:
		return c, &ConfigError{Field: "OutboxTable", Reason: "must be at most 48 bytes (PostgreSQL truncates longer names)"}
	}
	for _, l := range c.Lines {
		if !slices.Contains(AllLines(), l) {
			return c, &ConfigError{Field: "Lines", Reason: fmt.Sprintf("unknown migration line %q", l)}
		}
	}
	return c, nil
}

// Migration is one versioned step of a line, rendered for a Config.
type Migration struct {
	Line    Line
	Version int
	Name    string
	Up      string
	Down    string
}

// MigrationStatus says whether a migration has been applied.
type MigrationStatus struct {
	Line      Line
	Version   int
	Name      string
	Applied   bool
	AppliedAt time.Time
}

// Migrator applies the embedded migrations of some lines for one
// MigrateConfig: its schema and table names. Versions are recorded per line and table in
// dedupe_migration in the same schema.
type Migrator struct {
	db         DB
	drv        driver
	names      migrate.Names
	migrations []migrate.Migration
}

// NewMigrator returns a Migrator for cfg (the zero MigrateConfig for every
// line with the default names).
func NewMigrator(db DB, cfg MigrateConfig) (*Migrator, error) {
	drv, err := newDriver(db)
	if err != nil {
		return nil, err
	}
	names, ms, err := cfg.render()
	if err != nil {
		return nil, err
	}
	return &Migrator{db: db, drv: drv, names: names, migrations: ms}, nil
}

// render returns c's names and the migrations of its lines, line by line,
// oldest first.
func (c MigrateConfig) render() (migrate.Names, []migrate.Migration, error) {
	c, err := c.withDefaults()
	if err != nil {
		return migrate.Names{}, nil, err
	}
	names := migrate.Names{Schema: c.Schema, InboxTable: c.InboxTable, OutboxTable: c.OutboxTable}
	lines := make([]string, len(c.Lines))
	for i, l := range c.Lines {
		lines[i] = string(l)
	}
	ms, err := migrate.Render(migrationFS, names, lines...)
	return names, ms, err
}

// Migrate applies every pending migration of cfg's lines (the zero
// MigrateConfig: the inbox and the outbox with their default names). It is
// idempotent and safe to call from many processes at once. An Inbox's or
// an outbox.Outbox's own tables are cfg.Migration() of its Config (or outbox.Config).
func Migrate(ctx context.Context, db DB, cfg MigrateConfig) error {
	m, err := NewMigrator(db, cfg)
	if err != nil {
		return err
	}
	_, err = m.Up(ctx)
	return err
}

// Migrations returns the rendered migrations, line by line, oldest first.
func (m *Migrator) Migrations() []Migration { return public(m.migrations) }

// public returns ms as the package's Migrations.
func public(ms []migrate.Migration) []Migration {
	var out []Migration
	for _, m := range ms {
		out = append(out, Migration{Line: Line(m.Line), Version: m.Version, Name: m.Name, Up: m.Up, Down: m.Down})
	}
	return out
}

// inTx runs f in a transaction of the migrator's driver.
func (m *Migrator) inTx(ctx context.Context, f func(tx migrate.Querier) error) error {
	return inTx(ctx, m.drv, func(tx Querier) error { return f(tx) })
}

// Up applies the pending migrations in one transaction under an advisory
// lock and returns those it applied.
func (m *Migrator) Up(ctx context.Context) ([]Migration, error) {
	applied, err := migrate.Up(ctx, m.inTx, m.names, m.migrations)
	return public(applied), err
}

// Down reverts applied migrations newer than target (0 reverts all) in each
// of the migrator's lines, newest first, and returns those it reverted.
func (m *Migrator) Down(ctx context.Context, target int) ([]Migration, error) {
	reverted, err := migrate.Down(ctx, m.inTx, m.names, m.migrations, target)
	return public(reverted), err
}

// Status reports every known migration and whether it is applied. It only
// reads: a database never migrated reports every migration as pending.
func (m *Migrator) Status(ctx context.Context) ([]MigrationStatus, error) {
	states, err := migrate.Status(ctx, m.db, m.names, m.migrations)
	if err != nil {
		return nil, err
	}
	out := make([]MigrationStatus, 0, len(states))
	for _, s := range states {
		out = append(out, MigrationStatus{Line: Line(s.Line), Version: s.Version, Name: s.Name, Applied: s.Applied, AppliedAt: s.AppliedAt})
	}
	return out, nil
}

// PlainSQL returns the up migrations of cfg's lines (the zero MigrateConfig
// for every line with the default names) as one script, for users of goose,
// golang-migrate or atlas. The file sql/dedupe_inbox.sql in the repository is
// this script for the defaults.
func PlainSQL(cfg MigrateConfig) (string, error) {
	_, ms, err := cfg.render()
	if err != nil {
		return "", err
	}
	return migrate.Script("-- dedupe schema. Generated from migrations/*/*.up.sql by dedupe.PlainSQL; do not edit.\n", ms), nil
}
