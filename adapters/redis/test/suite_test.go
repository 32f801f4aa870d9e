package test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
	"github.com/exactlyonce/dedupe/internal/adaptertest"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/redistest"
)

// TestSuite runs the shared transport suite over pgx and database/sql. The
// suite's id is the entry's "id" field (DefaultKey); a duplicate is a second
// XADD of the same id, as a producer's retry would be.
func TestSuite(t *testing.T) {
	adaptertest.Run(t, adaptertest.Transport{
		Name:     "redis-streams",
		Features: adaptertest.Features{Poison: true},
		New: func(t *testing.T, db *dbtest.DB) adaptertest.Instance {
			rdb := redistest.Client(t)
			stream := redistest.Stream(t, rdb, "suite")
			if err := rdb.XGroupCreateMkStream(context.Background(), stream, group, "0").Err(); err != nil {
				t.Fatal(err)
			}
			return adaptertest.Instance{
				Publish: func(ctx context.Context, id string, body []byte) error {
					return rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"id", id, "body", body}}).Err()
				},
				Start:    start[pgx.Tx](t, rdb, stream),
				StartSQL: start[*sql.Tx](t, rdb, stream),
				Unacked: func(ctx context.Context) (int, error) {
					p, err := rdb.XPending(ctx, stream, group).Result()
					if err != nil {
						return 0, err
					}
					groups, err := rdb.XInfoGroups(ctx, stream).Result()
					if err != nil {
						return 0, err
					}
					for _, g := range groups {
						if g.Name == group {
							return int(p.Count + g.Lag), nil
						}
					}
					return -1, nil
				},
			}
		},
	})
}

// start runs a Runner on stream whose handler, of the inbox driver's
// transaction type TTx, runs the suite's effect.
func start[TTx any](t *testing.T, rdb *redis.Client, stream string) func(ctx context.Context, inbox *dedupe.Inbox, rc adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
	return func(ctx context.Context, inbox *dedupe.Inbox, rc adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
		r, err := deduperedis.New(inbox, rdb, stream, group, deduperedis.Config{
			Consumer:    redistest.Name("suite"),
			Workers:     rc.Workers,
			MaxAttempts: rc.MaxAttempts,
			Backoff:     func(int) time.Duration { return 20 * time.Millisecond },
			Block:       100 * time.Millisecond,
		}, func(ctx context.Context, tx TTx, msg *deduperedis.Message) error {
			return effect(ctx, tx, dedupe.ClaimFromContext(ctx).Key.ID, []byte(msg.Field("body")))
		})
		if err != nil {
			t.Fatalf("new runner: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		return func() error { return <-done }
	}
}
