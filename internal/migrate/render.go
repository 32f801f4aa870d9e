package migrate

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

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

func newTemplateData(n Names) templateData {
	d := templateData{
		Inbox:             n.qualify(n.InboxTable),
		InboxExpiresIndex: pgx.Identifier{n.InboxTable + "_expires_at_idx"}.Sanitize(),
		InboxKeyDomain:    n.qualify(n.InboxTable + "_keypart"),
		InboxStateDomain:  n.qualify(n.InboxTable + "_state"),

		Outbox:               n.qualify(n.OutboxTable),
		OutboxPendingIndex:   pgx.Identifier{n.OutboxTable + "_pending_idx"}.Sanitize(),
		OutboxKeyIndex:       pgx.Identifier{n.OutboxTable + "_key_idx"}.Sanitize(),
		OutboxPublishedIndex: pgx.Identifier{n.OutboxTable + "_published_idx"}.Sanitize(),
	}
	if n.Schema != "" {
		d.Schema = pgx.Identifier{n.Schema}.Sanitize()
	}
	d.InboxLiteral, d.InboxKeyDomainLiteral = sqlLiteral(d.Inbox), sqlLiteral(d.InboxKeyDomain)
	return d
}

// sqlLiteral quotes s as an SQL string literal.
func sqlLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Render reads the migrations of lines (migrations/<line>/NNN_name.up.sql
// and .down.sql in fsys) and fills in n's names: line by line, oldest first.
func Render(fsys fs.FS, n Names, lines ...string) ([]Migration, error) {
	var out []Migration
	for _, l := range lines {
		ms, err := renderLine(fsys, n, l)
		if err != nil {
			return nil, err
		}
		out = append(out, ms...)
	}
	return out, nil
}

// renderLine renders the migrations of one line, oldest first.
func renderLine(fsys fs.FS, n Names, line string) ([]Migration, error) {
	files, err := fs.Glob(fsys, "migrations/"+line+"/*.up.sql")
	if err != nil {
		return nil, err
	}
	data := newTemplateData(n)
	var out []Migration
	for _, f := range files {
		base := strings.TrimSuffix(path.Base(f), ".up.sql")
		num, name, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("dedupe: migration file %q is not named NNN_name.up.sql", f)
		}
		up, err := renderFile(fsys, f, data)
		if err != nil {
			return nil, err
		}
		down, err := renderFile(fsys, strings.TrimSuffix(f, ".up.sql")+".down.sql", data)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Line: line, Version: version, Name: name, Up: up, Down: down})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

func renderFile(fsys fs.FS, name string, data templateData) (string, error) {
	raw, err := fs.ReadFile(fsys, name)
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

// Script returns the up migrations of ms as one script, each under a
// comment naming it, after header.
func Script(header string, ms []Migration) string {
	var b strings.Builder
	b.WriteString(header)
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- %s/%03d_%s\n%s", m.Line, m.Version, m.Name, m.Up)
	}
	return b.String()
}
