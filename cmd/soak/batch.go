package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// batchSize is the most deliveries the batch transport claims at once.
const batchSize = 64

// runBatch consumes the broker in batches: one transaction claims every key
// of the batch with dedupe.Inbox.ClaimBatch and writes the effects of the
// claimed ones in one statement. A fault (handler error, killed connection)
// rolls the whole batch back; processBatch then runs each of its messages
// alone, and the ones that fail again are redelivered.
func runBatch(ctx context.Context, e *env, inputs []string) error {
	o := e.soak.opts
	pool, inbox, err := e.consumerInbox(ctx, int32(o.workers)+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	b := newBroker(inputs, e.faults, o.redelivery, &e.progress.acks)
	return consumeBroker(ctx, e, b, o.workers, batchSize, false, func(ctx context.Context, ds []delivery) []bool {
		return processBatch(ctx, e, inbox, ds)
	})
}

// processBatch claims and applies one batch in one transaction. When one
// message of it fails, the batch rolls back and each message is processed in
// a transaction of its own, as ClaimBatch's documentation prescribes, so the
// failure neither loses nor duplicates the others. It reports per delivery
// whether to acknowledge it.
func processBatch(ctx context.Context, e *env, inbox *dedupe.Inbox, ds []delivery) []bool {
	acks := make([]bool, len(ds))
	err := claimAndApply(ctx, e, inbox, ds)
	if err == nil {
		for i := range acks {
			acks[i] = true
		}
		return acks
	}
	if len(ds) == 1 {
		return acks
	}
	for i := range ds {
		acks[i] = claimAndApply(ctx, e, inbox, ds[i:i+1]) == nil
	}
	return acks
}

// claimAndApply runs one transaction over ds: ClaimBatch, then the effects
// of the claimed keys in one statement; each claimed message fails at random.
func claimAndApply(ctx context.Context, e *env, inbox *dedupe.Inbox, ds []delivery) error {
	keys := make([]dedupe.Key, len(ds))
	for i, d := range ds {
		keys[i] = dedupe.Key{Scope: e.scope, ID: d.id}
	}
	return pgx.BeginFunc(ctx, inbox.DB().(*pgxpool.Pool), func(tx pgx.Tx) error {
		claims, err := inbox.ClaimBatch(ctx, tx, keys)
		if err != nil {
			return err
		}
		var ids []string
		for i, c := range claims {
			switch c.Outcome {
			case dedupe.OutcomeClaimed:
				ids = append(ids, ds[i].id)
			case dedupe.OutcomeDuplicate:
			default:
				return fmt.Errorf("%w: %s for %s", errUnexpected, c.Outcome, ds[i].id)
			}
		}
		if len(ids) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, sqlInsertEffects, e.name, ids); err != nil {
			return err
		}
		for range ids {
			if e.faults.hit(faultError) {
				return errInjected
			}
		}
		return nil
	})
}
