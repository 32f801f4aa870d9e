package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
)

// redisGroup is the consumer group of the Redis rows.
const redisGroup = "bench"

// redisClient connects to REDIS_URL (default the machine's Redis) once,
// for the Redis rows.
func (b *bench) redisClient(ctx context.Context) (*redis.Client, error) {
	b.redisOnce.Do(func() {
		u := os.Getenv("REDIS_URL")
		if u == "" {
			u = "redis://127.0.0.1:6379/0"
		}
		opt, err := redis.ParseURL(u)
		if err != nil {
			b.redisErr = fmt.Errorf("REDIS_URL: %w", err)
			return
		}
		opt.PoolSize = 80
		rdb := redis.NewClient(opt)
		if err := rdb.Ping(ctx).Err(); err != nil {
			_ = rdb.Close()
			b.redisErr = fmt.Errorf("the Redis rows need Redis at %s (set REDIS_URL, or pass -only to leave them out): %w", opt.Addr, err)
			return
		}
		b.rdb = rdb
	})
	return b.rdb, b.redisErr
}

// redisStream empties the run's effects (reset), creates a stream with
// the group at 0 for one run and adds its backlog, each entry with a unique
// id field.
func (b *bench) redisStream(ctx context.Context, backlog int64) (*redis.Client, string, func(), error) {
	if err := b.reset(ctx, b.run); err != nil {
		return nil, "", nil, err
	}
	rdb, err := b.redisClient(ctx)
	if err != nil {
		return nil, "", nil, err
	}
	name := "dedupe-bench-" + b.run + "-" + strconv.FormatInt(b.seq.Add(1), 10)
	cleanup := func() { _ = rdb.Del(context.WithoutCancel(ctx), name).Err() }
	if err := rdb.XGroupCreateMkStream(ctx, name, redisGroup, "0").Err(); err != nil {
		return nil, "", nil, err
	}
	for i := int64(0); i < backlog; {
		pipe := rdb.Pipeline()
		for ; i < backlog && pipe.Len() < 1000; i++ {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: name, Values: []any{"id", b.run + "-" + strconv.FormatInt(i, 10), "body", body}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			cleanup()
			return nil, "", nil, err
		}
	}
	return rdb, name, cleanup, nil
}

// redisHand is the hand-written go-redis consumer: one XREADGROUP loop
// reading up to max(2×workers, 64) entries ahead, feeding w workers, each
// running the hand-written claim + effect transaction, committing, then
// XACK (handConsume).
func (b *bench) redisHand(ctx context.Context, w int, sp span) (*sample, error) {
	rdb, stream, cleanup, err := b.redisStream(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	win := newWindow(sp)
	return b.drainRow(ctx, win, func(rctx context.Context) (func() error, error) {
		msgs := make(chan redis.XMessage, max(2*w, 64))
		var wg sync.WaitGroup
		wg.Go(func() {
			defer close(msgs)
			for rctx.Err() == nil {
				res, err := rdb.XReadGroup(rctx, &redis.XReadGroupArgs{
					Group: redisGroup, Consumer: "hand", Streams: []string{stream, ">"},
					Count: int64(max(2*w, 64) - len(msgs)), Block: time.Second,
				}).Result()
				if err != nil {
					if !errors.Is(err, redis.Nil) && rctx.Err() == nil {
						win.fail(err)
					}
					continue
				}
				for _, s := range res {
					for _, m := range s.Messages {
						select {
						case msgs <- m:
						case <-rctx.Done():
							return
						}
					}
				}
			}
		})
		for range w {
			wg.Go(func() {
				handConsume(rctx, b, win, msgs,
					func(m redis.XMessage) string { id, _ := m.Values["id"].(string); return id },
					func(m redis.XMessage) error { return rdb.XAck(rctx, stream, redisGroup, m.ID).Err() },
					nil)
			})
		}
		return func() error { wg.Wait(); return nil }, nil
	})
}

// redisRunner drains the same backlog with deduperedis.Runner (runnerRow).
func (b *bench) redisRunner(ctx context.Context, w int, sp span) (*sample, error) {
	rdb, stream, cleanup, err := b.redisStream(ctx, sp.backlog)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return b.runnerRow(ctx, sp, func(inbox *dedupe.Inbox) (runner, error) {
		return deduperedis.New(inbox, rdb, stream, redisGroup, deduperedis.Config{
			Scope:    benchScope,
			Consumer: "runner",
			Workers:  w,
		}, effect[*deduperedis.Message])
	})
}
