package dedupe

import "context"

// Cleanup deletes published and discarded rows older than Retention on the
// database's clock, in bounded batches, and returns how many it deleted. Run
// calls it every CleanupInterval.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := r.ob.db.Exec(ctx, r.ob.q.cleanup, r.ob.dbNow(), seconds(r.cfg.Retention), r.ob.cfg.CleanupBatchSize)
		if err != nil {
			return total, translate(err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.ob.cfg.CleanupBatchSize) {
			return total, nil
		}
	}
}
