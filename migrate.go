package dedupe

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*/*.sql
var migrationFS embed.FS

// migrationLockID is the advisory lock every dedupe migration holds, so that
// processes starting at once apply each migration exactly once.
const migrationLockID int64 = 0x6465_6475_7065_6d67 // "dedupemg"

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
	cfg        MigrateConfig
	migrations []Migration
	tracking   string
}

// NewMigrator returns a Migrator for cfg (the zero MigrateConfig for every
// line with the default names).
func NewMigrator(db DB, cfg MigrateConfig) (*Migrator, error) {
	drv, err := newDriver(db)
	if err != nil {
		return nil, err
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, l := range c.Lines {
		lm, err := renderLine(c, l)
		if err != nil {
			return nil, err
		}
		ms = append(ms, lm...)
	}
	return &Migrator{db: db, drv: drv, cfg: c, migrations: ms, tracking: qualify(c.Schema, "dedupe_migration")}, nil
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
func (m *Migrator) Migrations() []Migration { return slices.Clone(m.migrations) }

// tableOf is the table a line's versions are recorded under.
func (c *MigrateConfig) tableOf(l Line) string {
	if l == LineOutbox {
		return c.OutboxTable
	}
	return c.InboxTable
}

type migrationID struct {
	line    Line
	version int
}

// Up applies the pending migrations in one transaction under an advisory
// lock and returns those it applied.
func (m *Migrator) Up(ctx context.Context) ([]Migration, error) {
	var applied []Migration
	err := m.locked(ctx, func(tx Querier, done map[migrationID]time.Time) error {
		for _, mig := range m.migrations {
			if _, ok := done[migrationID{mig.Line, mig.Version}]; ok {
				continue
			}
			if _, err := tx.Exec(ctx, mig.Up); err != nil {
				return fmt.Errorf("dedupe: migration %s/%03d_%s: %w", mig.Line, mig.Version, mig.Name, bare(err))
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+m.tracking+" (line, table_name, version, name, applied_at) VALUES ($1, $2, $3, $4, now())",
				string(mig.Line), m.cfg.tableOf(mig.Line), mig.Version, mig.Name); err != nil {
				return err
			}
			applied = append(applied, mig)
		}
		return nil
	})
	return applied, err
}

// Down reverts applied migrations newer than target (0 reverts all) in each
// of the migrator's lines, newest first, and returns those it reverted.
func (m *Migrator) Down(ctx context.Context, target int) ([]Migration, error) {
	var reverted []Migration
	err := m.locked(ctx, func(tx Querier, done map[migrationID]time.Time) error {
		for _, mig := range slices.Backward(m.migrations) {
			if _, ok := done[migrationID{mig.Line, mig.Version}]; !ok || mig.Version <= target {
				continue
			}
			if _, err := tx.Exec(ctx, mig.Down); err != nil {
				return fmt.Errorf("dedupe: revert %s/%03d_%s: %w", mig.Line, mig.Version, mig.Name, bare(err))
			}
			if _, err := tx.Exec(ctx, "DELETE FROM "+m.tracking+" WHERE line = $1 AND table_name = $2 AND version = $3",
				string(mig.Line), m.cfg.tableOf(mig.Line), mig.Version); err != nil {
				return err
			}
			reverted = append(reverted, mig)
		}
		return nil
	})
	return reverted, err
}

// Status reports every known migration and whether it is applied. It only
// reads: a database never migrated reports every migration as pending.
func (m *Migrator) Status(ctx context.Context) ([]MigrationStatus, error) {
	var exists bool
	if err := m.db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", m.tracking).Scan(&exists); err != nil {
		return nil, err
	}
	done := map[migrationID]time.Time{}
	if exists {
		var err error
		if done, err = m.applied(ctx, m.db); err != nil {
			return nil, err
		}
	}
	out := make([]MigrationStatus, 0, len(m.migrations))
	for _, mig := range m.migrations {
		at, ok := done[migrationID{mig.Line, mig.Version}]
		out = append(out, MigrationStatus{Line: mig.Line, Version: mig.Version, Name: mig.Name, Applied: ok, AppliedAt: at})
	}
	return out, nil
}

// applied reads the recorded versions of the migrator's lines and tables.
func (m *Migrator) applied(ctx context.Context, q Querier) (map[migrationID]time.Time, error) {
	rows, err := q.Query(ctx, "SELECT line, table_name, version, applied_at FROM "+m.tracking)
	if err != nil {
		return nil, err
	}
	done := map[migrationID]time.Time{}
	var (
		line, table string
		v           int
		at          time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&line, &table, &v, &at}, func() error {
		if table == m.cfg.tableOf(Line(line)) {
			done[migrationID{Line(line), v}] = at
		}
		return nil
	})
	return done, err
}

// locked runs f in a transaction holding the migration lock, with the
// tracking table present and its applied versions read.
func (m *Migrator) locked(ctx context.Context, f func(tx Querier, done map[migrationID]time.Time) error) error {
	return inTx(ctx, m.drv, func(tx Querier) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLockID); err != nil {
			return err
		}
		if m.cfg.Schema != "" {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{m.cfg.Schema}.Sanitize()); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+m.tracking+` (
    line       text NOT NULL,
    table_name text NOT NULL,
    version    integer NOT NULL,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL,
    PRIMARY KEY (line, table_name, version))`); err != nil {
			return err
		}
		done, err := m.applied(ctx, tx)
		if err != nil {
			return err
		}
		return f(tx, done)
	})
}

// templateData are the names a migration may refer to.
type templateData struct {
	Schema            string // quoted schema, or "" for search_path
	Inbox             string // quoted, qualified inbox table
	InboxExpiresIndex string // quoted index name (unqualified: it lives with its table)
	InboxLiteral      string // the qualified inbox table as a string literal (for ::regclass)
	// The domains of the inbox's scope and key columns and of its state
	// column (quoted, qualified: types live in the table's schema), and the
	// key domain as a string literal (for to_regtype).
	InboxKeyDomain, InboxStateDomain, InboxKeyDomainLiteral string

	Outbox               string // quoted, qualified outbox table
	OutboxPendingIndex   string // quoted index names of the outbox
	OutboxKeyIndex       string
	OutboxPublishedIndex string
}

func newTemplateData(c MigrateConfig) templateData {
	d := templateData{
		Inbox:             qualify(c.Schema, c.InboxTable),
		InboxExpiresIndex: pgx.Identifier{c.InboxTable + "_expires_at_idx"}.Sanitize(),
		InboxKeyDomain:    qualify(c.Schema, c.InboxTable+"_keypart"),
		InboxStateDomain:  qualify(c.Schema, c.InboxTable+"_state"),

		Outbox:               qualify(c.Schema, c.OutboxTable),
		OutboxPendingIndex:   pgx.Identifier{c.OutboxTable + "_pending_idx"}.Sanitize(),
		OutboxKeyIndex:       pgx.Identifier{c.OutboxTable + "_key_idx"}.Sanitize(),
		OutboxPublishedIndex: pgx.Identifier{c.OutboxTable + "_published_idx"}.Sanitize(),
	}
	if c.Schema != "" {
		d.Schema = pgx.Identifier{c.Schema}.Sanitize()
	}
	d.InboxLiteral, d.InboxKeyDomainLiteral = sqlLiteral(d.Inbox), sqlLiteral(d.InboxKeyDomain)
	return d
}

// sqlLiteral quotes s as an SQL string literal.
func sqlLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// renderLine reads the embedded migrations of line l and fills in c's names.
func renderLine(c MigrateConfig, l Line) ([]Migration, error) {
	if !slices.Contains(AllLines(), l) {
		return nil, &ConfigError{Field: "lines", Reason: fmt.Sprintf("unknown migration line %q", l)}
	}
	files, err := fs.Glob(migrationFS, "migrations/"+string(l)+"/*.up.sql")
	if err != nil {
		return nil, err
	}
	data := newTemplateData(c)
	var out []Migration
	for _, f := range files {
		base := strings.TrimSuffix(path.Base(f), ".up.sql")
		num, name, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("dedupe: migration file %q is not named NNN_name.up.sql", f)
		}
		up, err := renderFile(f, data)
		if err != nil {
			return nil, err
		}
		down, err := renderFile(strings.TrimSuffix(f, ".up.sql")+".down.sql", data)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Line: l, Version: version, Name: name, Up: up, Down: down})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

func renderFile(name string, data templateData) (string, error) {
	raw, err := migrationFS.ReadFile(name)
	if err != nil {
		return "", err
	}
	t, err := template.New(name).Option("missingkey=error").Parse(string(raw))
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// PlainSQL returns the up migrations of cfg's lines (the zero MigrateConfig
// for every line with the default names) as one script, for users of goose,
// golang-migrate or atlas. The file sql/dedupe_inbox.sql in the repository is
// this script for the defaults.
func PlainSQL(cfg MigrateConfig) (string, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("-- dedupe schema. Generated from migrations/*/*.up.sql by dedupe.PlainSQL; do not edit.\n")
	for _, l := range c.Lines {
		ms, err := renderLine(c, l)
		if err != nil {
			return "", err
		}
		for _, m := range ms {
			fmt.Fprintf(&b, "\n-- %s/%03d_%s\n%s", m.Line, m.Version, m.Name, m.Up)
		}
	}
	return b.String(), nil
}
