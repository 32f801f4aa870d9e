package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// benchScope is the inbox scope of the measured keys.
const benchScope = "bench"

// body is the effect's payload.
const body = `{"order":"o-1","total":1900,"currency":"EUR"}`

// scenario is one line of the main table, run for every worker count.
type scenario struct {
	name     string
	baseline string // the hand-written equivalent, "" for the reference
	unit     func(o *options) string
	op       func(b *bench) op
}

// scenarios in report order; a baseline precedes the scenarios compared with it.
var scenarios = []scenario{
	{name: "hand-written tx: effect only", unit: perMsg, op: func(b *bench) op { return b.opHandEffect }},
	{name: "hand-written tx: claim + effect", baseline: "hand-written tx: effect only", unit: perMsg, op: func(b *bench) op { return b.opHandClaimEffect }},
	{name: "Consumer.Handle", baseline: "hand-written tx: claim + effect", unit: perMsg, op: func(b *bench) op { return b.opHandle }},
	{name: "hand-written batch: claim + effects", baseline: "", unit: perBatch, op: func(b *bench) op { return b.opHandBatch }},
	{name: "Inbox.ClaimBatch + effects", baseline: "hand-written batch: claim + effects", unit: perBatch, op: func(b *bench) op { return b.opClaimBatch }},
}

func perMsg(*options) string     { return "msg" }
func perBatch(o *options) string { return "batch of " + strconv.Itoa(o.batch) }

// bench is the state shared by the scenarios of one run.
type bench struct {
	opts     *options
	pool     *pgxpool.Pool
	inbox    *dedupe.Inbox
	consumer *dedupe.Consumer[string]
	seq      atomic.Int64
	run      string // distinguishes the keys of successive rows
}

func newBench(o *options, pool *pgxpool.Pool) (*bench, error) {
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		return nil, err
	}
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{
		Scope: benchScope,
		Key:   func(id string) (string, error) { return id, nil },
	}, func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, sqlEffect, id, body)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &bench{opts: o, pool: pool, inbox: inbox, consumer: c}, nil
}

// nextID returns a key never used before in this run.
func (b *bench) nextID() string {
	return b.run + "-" + strconv.FormatInt(b.seq.Add(1), 10)
}

func (b *bench) opHandEffect(ctx context.Context, _ int) (int, error) {
	id := b.nextID()
	return 1, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sqlEffect, id, body)
		return err
	})
}

func (b *bench) opHandClaimEffect(ctx context.Context, _ int) (int, error) {
	return 1, b.handClaimEffectTx(ctx, benchScope, b.nextID())
}

// handClaimEffectTx is the hand-written per-message transaction: claim the
// key, write the effect unless it was a duplicate, commit. The transport
// baselines run it too.
func (b *bench) handClaimEffectTx(ctx context.Context, scope, id string) error {
	now := time.Now()
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, sqlHandClaim, scope, id, now, now.Add(dedupe.DefaultRetention)).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // a duplicate: no effect
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, sqlEffect, id, body)
		return err
	})
}

func (b *bench) opHandle(ctx context.Context, _ int) (int, error) {
	outcome, err := b.consumer.Handle(ctx, b.nextID())
	if err == nil && outcome != dedupe.OutcomeClaimed {
		err = fmt.Errorf("bench: outcome %s for a new key", outcome)
	}
	return 1, err
}

// batchIDs returns the sorted, new keys of one batch.
func (b *bench) batchIDs() []string {
	ids := make([]string, b.opts.batch)
	for i := range ids {
		ids[i] = b.nextID()
	}
	slices.Sort(ids)
	return ids
}

func (b *bench) opHandBatch(ctx context.Context, _ int) (int, error) {
	ids := b.batchIDs()
	now := time.Now()
	return len(ids), pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlHandClaimBatch, benchScope, ids, now, now.Add(dedupe.DefaultRetention))
		if err != nil {
			return err
		}
		claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, sqlEffects, claimed, body)
		return err
	})
}

func (b *bench) opClaimBatch(ctx context.Context, _ int) (int, error) {
	ids := b.batchIDs()
	keys := make([]dedupe.Key, len(ids))
	for i, id := range ids {
		keys[i] = dedupe.Key{Scope: benchScope, ID: id}
	}
	return len(ids), pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		claims, err := b.inbox.ClaimBatch(ctx, tx, keys)
		if err != nil {
			return err
		}
		claimed := make([]string, 0, len(claims))
		for _, c := range claims {
			if c.Outcome == dedupe.OutcomeClaimed {
				claimed = append(claimed, c.Key.ID)
			}
		}
		_, err = tx.Exec(ctx, sqlEffects, claimed, body)
		return err
	})
}
