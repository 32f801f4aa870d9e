// Package txopts translates pgx's transaction options for database/sql, for
// the core's and httpidem's database/sql drivers.
package txopts

import (
	"database/sql"

	"github.com/jackc/pgx/v5"
)

// SQL returns opts as database/sql's options. DeferrableMode has no
// counterpart there: the caller sets it with a statement.
func SQL(opts pgx.TxOptions) *sql.TxOptions {
	so := &sql.TxOptions{ReadOnly: opts.AccessMode == pgx.ReadOnly}
	switch opts.IsoLevel {
	case pgx.Serializable:
		so.Isolation = sql.LevelSerializable
	case pgx.RepeatableRead:
		so.Isolation = sql.LevelRepeatableRead
	case pgx.ReadCommitted:
		so.Isolation = sql.LevelReadCommitted
	case pgx.ReadUncommitted:
		so.Isolation = sql.LevelReadUncommitted
	}
	return so
}
