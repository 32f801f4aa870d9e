package migrate

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockID is the advisory lock every dedupe migration holds, so that
// processes starting at once apply each migration exactly once.
const lockID int64 = 0x6465_6475_7065_6d67 // "dedupemg"

// locked runs f in a transaction holding the migration lock, with n's
// schema and tracking table present and its applied versions read.
func locked(ctx context.Context, inTx InTx, n Names, f func(tx Querier, done map[id]time.Time) error) error {
	return inTx(ctx, func(tx Querier) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockID); err != nil {
			return err
		}
		if n.Schema != "" {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{n.Schema}.Sanitize()); err != nil {
				return err
			}
		}
		if err := createTracking(ctx, tx, n); err != nil {
			return err
		}
		done, err := applied(ctx, tx, n)
		if err != nil {
			return err
		}
		return f(tx, done)
	})
}
