package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// workerConfig is what the worker writes.
type workerConfig struct {
	// scope is the inbox scope of this worker's keys. Defaults to
	// "airflow-worker".
	scope string
	// account is credited once per logical run. Defaults to "payouts".
	account string
	// amount is the credit in cents. Defaults to 100.
	amount int64
	// hold keeps the transaction open after the writes, before the commit.
	// Defaults to 0; demos set it to watch a concurrent try wait, or to kill
	// a try mid-transaction.
	hold time.Duration
}

// worker writes a task run's effects once, in transactional mode: the claim
// of the run's key and the writes share one transaction, so they commit
// together or not at all. A retry after a commit finds the key and writes
// nothing; a retry after a crash finds no key (the transaction rolled back)
// and writes. Nothing is leased, so a killed try never blocks its retry.
type worker struct {
	cfg      workerConfig
	log      *slog.Logger
	consumer *dedupe.Consumer[TaskRun]
}

func newWorker(db dedupe.DB, cfg workerConfig, log *slog.Logger) (*worker, error) {
	inbox, err := dedupe.New(db, dedupe.Config{Logger: log})
	if err != nil {
		return nil, err
	}
	w := &worker{cfg: cfg, log: log}
	w.consumer, err = dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[TaskRun]{
		Scope: cfg.scope,
		Key:   func(r TaskRun) (string, error) { return r.Key(), nil },
	}, w.write)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// handle processes the run: dedupe.OutcomeClaimed when this try wrote,
// dedupe.OutcomeDuplicate when an earlier try already had.
func (w *worker) handle(ctx context.Context, r TaskRun) (dedupe.Outcome, error) {
	return w.consumer.Handle(ctx, r)
}

// write is the task's work, inside the claim's transaction.
func (w *worker) write(ctx context.Context, tx pgx.Tx, r TaskRun) error {
	w.log.InfoContext(ctx, "claimed the run; writing", "key", r.Key())
	if _, err := tx.Exec(ctx, sqlInsertLedger, r.DagID, r.TaskID, r.RunID, r.MapIndex, r.LogicalDate, r.Try, w.cfg.amount); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlCredit, w.cfg.account, w.cfg.amount); err != nil {
		return err
	}
	if w.cfg.hold > 0 {
		select {
		case <-time.After(w.cfg.hold):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
