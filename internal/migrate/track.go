package migrate

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// trackingTable records the applied versions of every line and table of a
// schema.
const trackingTable = "dedupe_migration"

// id names a migration of a line.
type id struct {
	line    string
	version int
}

// createTracking creates n's tracking table if missing.
func createTracking(ctx context.Context, tx Querier, n Names) error {
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+n.qualify(trackingTable)+` (
    line       text NOT NULL,
    table_name text NOT NULL,
    version    integer NOT NULL,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL,
    PRIMARY KEY (line, table_name, version))`)
	return err
}

// applied reads the recorded versions of n's tables.
func applied(ctx context.Context, q Querier, n Names) (map[id]time.Time, error) {
	rows, err := q.Query(ctx, "SELECT line, table_name, version, applied_at FROM "+n.qualify(trackingTable))
	if err != nil {
		return nil, err
	}
	done := map[id]time.Time{}
	var (
		line, table string
		v           int
		at          time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&line, &table, &v, &at}, func() error {
		if table == n.TableOf(line) {
			done[id{line, v}] = at
		}
		return nil
	})
	return done, err
}

// record notes m as applied to n's table.
func record(ctx context.Context, tx Querier, n Names, m Migration) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+n.qualify(trackingTable)+" (line, table_name, version, name, applied_at) VALUES ($1, $2, $3, $4, now())",
		m.Line, n.TableOf(m.Line), m.Version, m.Name)
	return err
}

// forget removes m's record from n's table.
func forget(ctx context.Context, tx Querier, n Names, m Migration) error {
	_, err := tx.Exec(ctx, "DELETE FROM "+n.qualify(trackingTable)+" WHERE line = $1 AND table_name = $2 AND version = $3",
		m.Line, n.TableOf(m.Line), m.Version)
	return err
}

// State is a migration and whether it is applied.
type State struct {
	Migration
	Applied   bool
	AppliedAt time.Time
}

// Status reports every migration of ms and whether it is applied to n's
// tables. It only reads: a database never migrated reports every migration
// as pending.
func Status(ctx context.Context, q Querier, n Names, ms []Migration) ([]State, error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", n.qualify(trackingTable)).Scan(&exists); err != nil {
		return nil, err
	}
	done := map[id]time.Time{}
	if exists {
		var err error
		if done, err = applied(ctx, q, n); err != nil {
			return nil, err
		}
	}
	out := make([]State, 0, len(ms))
	for _, m := range ms {
		at, ok := done[id{m.Line, m.Version}]
		out = append(out, State{Migration: m, Applied: ok, AppliedAt: at})
	}
	return out, nil
}
