package dedupe

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The relay records a batch's outcome in the transaction that claimed it:
// confirmed rows are marked published (or deleted), failed ones count an
// attempt and get their retry time, and those out of attempts, or refused
// with a Permanent error, are parked. Every time is the database's clock.

// recorded is what record wrote, for report once it committed.
type recorded struct {
	confirmed []*OutboxMessage
	lags      map[int64]time.Duration // by Seq, when Hooks.Published is set
	failures  []failure
	parked    []bool // per failure
}

// record writes the outcome of the batch in tx.
func (r *Relay) record(ctx context.Context, tx pgx.Tx, confirmed []*OutboxMessage, failures []failure) (recorded, error) {
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
		delays[i] = seconds(jitter(r.backoff(f.msg.Attempt)))
		rec.parked[i] = IsPermanent(f.err) || (r.cfg.MaxAttempts > 0 && f.msg.Attempt >= r.cfg.MaxAttempts)
	}
	if _, err := tx.Exec(ctx, r.ob.q.recordFailures, ids, errs, delays, rec.parked, now); err != nil {
		return rec, translate(err)
	}
	return rec, nil
}

// markPublished marks (or deletes) the confirmed rows, reading their lags
// from the database when the Published hook wants them.
func (r *Relay) markPublished(ctx context.Context, tx pgx.Tx, ids []int64, now *time.Time, rec *recorded) error {
	if r.cfg.Hooks.Published == nil {
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

// report calls the hooks and logs the failures of a committed outcome.
func (r *Relay) report(ctx context.Context, rec recorded) {
	if r.cfg.Hooks.Published != nil {
		for _, m := range rec.confirmed {
			r.cfg.Hooks.Published(m, rec.lags[m.Seq])
		}
	}
	for i, f := range rec.failures {
		r.hookFailed(f.msg, f.err, rec.parked[i])
		if rec.parked[i] {
			r.cfg.Logger.ErrorContext(ctx, "dedupe: outbox message parked", "id", f.msg.ID, "topic", f.msg.Topic,
				"key", f.msg.Key, "attempts", f.msg.Attempt, "err", f.err)
		} else {
			r.cfg.Logger.WarnContext(ctx, "dedupe: outbox publish failed", "id", f.msg.ID, "topic", f.msg.Topic,
				"key", f.msg.Key, "attempt", f.msg.Attempt, "err", f.err)
		}
	}
}

func (r *Relay) hookFailed(m *OutboxMessage, err error, parked bool) {
	if r.cfg.Hooks.Failed != nil {
		r.cfg.Hooks.Failed(m, err, parked)
	}
}
