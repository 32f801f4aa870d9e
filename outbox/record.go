package outbox

import (
	"context"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// The relay records a batch's outcome in the transaction that claimed it:
// confirmed rows are marked published (or deleted), failed ones count an
// attempt and get their retry time, and those out of attempts, or refused
// with a Permanent error, are parked. Every time is the database's clock.

// recorded is what record wrote, for report once it committed.
type recorded struct {
	confirmed []*StoredMessage
	lags      map[int64]time.Duration // by Seq, when an Observer is set
	failures  []failure
	parked    []bool // per failure
}

// record writes the outcome of the batch in tx.
func (r *Relay) record(ctx context.Context, tx dedupe.Querier, confirmed []*StoredMessage, failures []failure) (recorded, error) {
	rec := recorded{confirmed: confirmed, failures: failures, parked: make([]bool, len(failures))}
	now := r.ob.dbNow()
	if len(confirmed) > 0 {
		ids := make([]int64, len(confirmed))
		for i, m := range confirmed {
			ids[i] = m.Seq
		}
		if err := r.markPublished(ctx, tx, ids, now, &rec); err != nil {
			return rec, err
		}
	}
	if len(failures) == 0 {
		return rec, nil
	}
	var (
		ids    = make([]int64, len(failures))
		errs   = make([]string, len(failures))
		delays = make([]float64, len(failures))
	)
	for i, f := range failures {
		ids[i], errs[i] = f.msg.Seq, f.err.Error()
		delays[i] = seconds(r.backoff(f.msg.Attempt))
		rec.parked[i] = dedupe.IsPermanent(f.err) || (r.cfg.MaxAttempts > 0 && f.msg.Attempt >= r.cfg.MaxAttempts)
	}
	if _, err := tx.Exec(ctx, r.ob.q.recordFailures, ids, errs, delays, rec.parked, now); err != nil {
		return rec, translate(err)
	}
	return rec, nil
}

// markPublished marks (or deletes) the confirmed rows, reading their lags
// from the database when an Observer wants them.
func (r *Relay) markPublished(ctx context.Context, tx dedupe.Querier, ids []int64, now *time.Time, rec *recorded) error {
	if r.cfg.Observer == nil {
		q, args := r.ob.q.markPublished, []any{ids, now}
		if r.cfg.DeletePublished {
			q, args = r.ob.q.deletePublished, args[:1]
		}
		_, err := tx.Exec(ctx, q, args...)
		return translate(err)
	}
	q := r.ob.q.markPublishedLag
	if r.cfg.DeletePublished {
		q = r.ob.q.deletePublishedLag
	}
	rows, err := tx.Query(ctx, q, ids, now)
	if err != nil {
		return translate(err)
	}
	rec.lags = make(map[int64]time.Duration, len(ids))
	var (
		id  int64
		lag float64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &lag}, func() error {
		rec.lags[id] = max(fromSeconds(lag), 0)
		return nil
	})
	return translate(err)
}

// report tells the Observer and logs the outcome of a committed batch.
func (r *Relay) report(ctx context.Context, rec recorded, obs publishObs) {
	for _, m := range rec.confirmed {
		obs.done(m, PublishDone{Lag: rec.lags[m.Seq]})
	}
	for i, f := range rec.failures {
		obs.done(f.msg, PublishDone{Err: f.err, Parked: rec.parked[i]})
		if rec.parked[i] {
			r.cfg.Logger.ErrorContext(ctx, "dedupe: outbox message parked", "id", f.msg.ID, "topic", f.msg.Topic,
				"key", f.msg.Key, "attempts", f.msg.Attempt, "err", f.err)
		} else {
			r.cfg.Logger.WarnContext(ctx, "dedupe: outbox publish failed", "id", f.msg.ID, "topic", f.msg.Topic,
				"key", f.msg.Key, "attempt", f.msg.Attempt, "err", f.err)
		}
	}
}

// publishObs holds the Observer's done of each message of a batch being
// published (by Seq); without an Observer it is nil and does nothing.
type publishObs map[int64]func(PublishDone)

// startPublish tells the Observer the batch's publishes start.
func (r *Relay) startPublish(ctx context.Context, batch []*StoredMessage) publishObs {
	if r.cfg.Observer == nil {
		return nil
	}
	obs := make(publishObs, len(batch))
	for _, m := range batch {
		_, obs[m.Seq] = r.cfg.Observer.StartPublish(ctx, m)
	}
	return obs
}

// done ends m's publish for the Observer.
func (o publishObs) done(m *StoredMessage, d PublishDone) {
	if f := o[m.Seq]; f != nil {
		f(d)
		delete(o, m.Seq)
	}
}

// fail ends every publish not ended yet with err: the batch's outcome did not
// commit, so each message is published again later.
func (o publishObs) fail(batch []*StoredMessage, err error) {
	for _, m := range batch {
		o.done(m, PublishDone{Err: err})
	}
}
