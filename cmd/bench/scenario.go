package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/pgerr"
)

// benchScope is the inbox scope of the measured keys.
const benchScope = "bench"

// body is the effect's payload.
const body = `{"order":"o-1","total":1900,"currency":"EUR"}`

// bench is the state shared by the rows of one run.
type bench struct {
	opts     *options
	pool     *pgxpool.Pool
	meter    meter
	inbox    *dedupe.Inbox
	consumer *dedupe.Consumer[string]
	http     *httpBench
	js       jetstream.JetStream // the in-process NATS server of the transport rows
	// rdb is the Redis of the Redis rows (REDIS_URL), connected once.
	rdb       *redis.Client
	redisOnce sync.Once
	redisErr  error
	backlogs  backlogs
	seq       atomic.Int64
	run       string // distinguishes the keys of successive runs
	dupRun    string // the prefix of the committed keys the duplicate rows redeliver
	// connConfig is the pool's connection settings, counting dialer
	// included, from which the database/sql rows open their *sql.DB.
	connConfig *pgx.ConnConfig
	sql        *sqlBench // the database/sql rows' side, once opened
}

func newBench(o *options, pool *pgxpool.Pool, m meter) (*bench, error) {
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
	return &bench{opts: o, pool: pool, meter: m, inbox: inbox, consumer: c}, nil
}

// nextID returns a key never used before in this run.
func (b *bench) nextID() string {
	return b.run + "-" + strconv.FormatInt(b.seq.Add(1), 10)
}

// dupID returns one of the -dup-keys committed keys, in turn.
func (b *bench) dupID() string {
	return b.dupRun + "-" + strconv.FormatInt(b.seq.Add(1)%int64(b.opts.dupKeys), 10)
}

// reset empties the tables and gives the next run its own keys.
func (b *bench) reset(ctx context.Context, tag string) error {
	b.run = tag
	return truncate(ctx, b.pool, sqlReset)
}

// truncate runs stmt, a TRUNCATE of tables the previous run wrote, again
// after a deadlock. A run's end cancels its last transactions, and pgx
// gives up a cancelled connection at once, but its server backend still
// runs the statements it had received (a pipelined claim, the effect)
// until it reads the end of the connection; the TRUNCATE, locking its
// tables one after the other, can deadlock with it (.ci/run saw 40P01 in
// the reset before a Kafka row). The backend's transaction ends with it, so
// the next try goes through.
func truncate(ctx context.Context, pool *pgxpool.Pool, stmt string) error {
	for try := 1; ; try++ {
		_, err := pool.Exec(ctx, stmt)
		if code, ok := pgerr.SQLState(err); !ok || code != "40P01" || try == truncateRetries {
			return err
		}
	}
}

// truncateRetries bounds truncate's tries.
const truncateRetries = 5

// preloadDuplicates commits -dup-keys keys for the duplicate rows.
func (b *bench) preloadDuplicates(ctx context.Context) error {
	b.dupRun = "dup" + strconv.FormatInt(b.seq.Add(1), 10)
	if _, err := b.pool.Exec(ctx, sqlPreloadComplete, benchScope, b.opts.dupKeys, b.dupRun,
		time.Now().Add(dedupe.DefaultRetention)); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, "ANALYZE dedupe_inbox")
	return err
}

func (b *bench) opHandEffect(ctx context.Context, _ int) (int, error) {
	id := b.nextID()
	return 1, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sqlEffect, id, body)
		return err
	})
}

func (b *bench) opHandClaimEffect(ctx context.Context, _ int) (int, error) {
	claimed, err := b.handClaimEffectTx(ctx, benchScope, b.nextID())
	if err == nil && !claimed {
		err = errors.New("bench: a new key was taken")
	}
	return 1, err
}

// handClaimEffectTx is the hand-written per-message transaction: claim the
// key, and for a new one write the effect; for a taken one read its row to
// tell a duplicate (complete) from a key still in flight or failed, as the
// library does; commit. The transport baselines run it too.
func (b *bench) handClaimEffectTx(ctx context.Context, scope, id string) (claimed bool, err error) {
	// A deadlock or serialization failure runs the transaction again, as
	// the library does (and a careful consumer must: the broker would
	// otherwise redeliver it only after its ack wait).
	for try := 1; ; try++ {
		claimed, err = b.handClaimEffectOnce(ctx, scope, id)
		if code, ok := pgerr.SQLState(err); !ok || (code != "40001" && code != "40P01") || try == handRetries {
			return claimed, err
		}
	}
}

// handRetries bounds the hand-written transaction's runs.
const handRetries = 3

// handClaimEffectOnce is one run of handClaimEffectTx's transaction.
func (b *bench) handClaimEffectOnce(ctx context.Context, scope, id string) (claimed bool, err error) {
	now := time.Now()
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, sqlHandClaim, scope, id, now, now.Add(dedupe.DefaultRetention)).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return classifyHand(tx.QueryRow(ctx, sqlHandClassify, scope, id), id)
		}
		if err != nil {
			return err
		}
		claimed = true
		_, err = tx.Exec(ctx, sqlEffect, id, body)
		return err
	})
	return claimed, err
}

// classifyHand reads a taken key's row (row, of sqlHandClassify) as a
// hand-written consumer must to know what to tell its broker: only a
// complete key is a duplicate to acknowledge. row is a pgx.Row or a *sql.Row.
func classifyHand(row interface{ Scan(dest ...any) error }, id string) error {
	var (
		state       string
		attempts    int
		lockedUntil *time.Time
		fingerprint []byte
	)
	if err := row.Scan(&state, &attempts, &lockedUntil, &fingerprint); err != nil {
		return err
	}
	if state != string(dedupe.StateComplete) {
		return fmt.Errorf("bench: key %s is %s, not a duplicate", id, state)
	}
	return nil
}

func (b *bench) opHandDup(ctx context.Context, _ int) (int, error) {
	claimed, err := b.handClaimEffectTx(ctx, benchScope, b.dupID())
	if err == nil && claimed {
		err = errors.New("bench: a committed key was claimed again")
	}
	return 1, err
}

func (b *bench) opHandle(ctx context.Context, _ int) (int, error) {
	outcome, err := b.consumer.Handle(ctx, b.nextID())
	if err == nil && outcome != dedupe.OutcomeClaimed {
		err = fmt.Errorf("bench: outcome %s for a new key", outcome)
	}
	return 1, err
}

func (b *bench) opHandleDup(ctx context.Context, _ int) (int, error) {
	outcome, err := b.consumer.Handle(ctx, b.dupID())
	if err == nil && outcome != dedupe.OutcomeDuplicate {
		err = fmt.Errorf("bench: outcome %s for a committed key", outcome)
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
