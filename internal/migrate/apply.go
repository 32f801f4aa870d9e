package migrate

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/exactlyonce/dedupe/internal/errtext"
)

// Up applies the migrations of ms not yet applied to n's tables, in order,
// in one transaction under the migration lock, and returns those it applied.
func Up(ctx context.Context, inTx InTx, n Names, ms []Migration) ([]Migration, error) {
	var done []Migration
	err := locked(ctx, inTx, n, func(tx Querier, applied map[id]time.Time) error {
		for _, m := range ms {
			if _, ok := applied[id{m.Line, m.Version}]; ok {
				continue
			}
			if _, err := tx.Exec(ctx, m.Up); err != nil {
				return fmt.Errorf("dedupe: migration %s/%03d_%s: %w", m.Line, m.Version, m.Name, errtext.Bare(err))
			}
			if err := record(ctx, tx, n, m); err != nil {
				return err
			}
			done = append(done, m)
		}
		return nil
	})
	return done, err
}

// Down reverts the applied migrations of ms newer than target (0 reverts
// all), newest first, in one transaction under the migration lock, and
// returns those it reverted.
func Down(ctx context.Context, inTx InTx, n Names, ms []Migration, target int) ([]Migration, error) {
	var reverted []Migration
	err := locked(ctx, inTx, n, func(tx Querier, applied map[id]time.Time) error {
		for _, m := range slices.Backward(ms) {
			if _, ok := applied[id{m.Line, m.Version}]; !ok || m.Version <= target {
				continue
			}
			if _, err := tx.Exec(ctx, m.Down); err != nil {
				return fmt.Errorf("dedupe: revert %s/%03d_%s: %w", m.Line, m.Version, m.Name, errtext.Bare(err))
			}
			if err := forget(ctx, tx, n, m); err != nil {
				return err
			}
			reverted = append(reverted, m)
		}
		return nil
	})
	return reverted, err
}
