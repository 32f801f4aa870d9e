package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
	"github.com/exactlyonce/dedupe/internal/redistest"
)

// redisGroup is the consumer group of the redis transport.
const redisGroup = "soak"

// redisCutEvery is how many committed effects pass between two kills of
// the in-process runners' Redis connections.
const redisCutEvery = 40

// redisClaimIdle is short so that the entries a killed worker held are
// reclaimed soon.
const redisClaimIdle = time.Second

// redisURL is REDIS_URL, else the machine's Redis.
func redisURL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return redistest.DefaultURL
}

// redisConnect connects to url with the client name name.
func redisConnect(ctx context.Context, url, name string) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	opt.ClientName = name
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("Redis does not answer at %s: %w (start it: %s; or set REDIS_URL)", opt.Addr, err, redistest.StartCommand)
	}
	return rdb, nil
}

// runRedis soaks the Redis Streams runner against the machine's Redis: a
// stream of its own, every input added with its id in the "id" field (the
// keyless inputs without it, so the runner records and dead-letters them)
// and its id in "body", two in-process runners whose Redis connections are
// killed (CLIENT KILL) every redisCutEvery effects (one runner also stopped
// and restarted at random), and a worker subprocess in the same group that
// is killed mid-transaction, whose pending entries the others reclaim after
// redisClaimIdle. The dead-letter stream is read at the end.
func runRedis(ctx context.Context, e *env, inputs []string) error {
	admin, err := redisConnect(ctx, redisURL(), "dedupe-soak-admin")
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close() }()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	stream := "dedupe-soak-" + hex.EncodeToString(rnd[:])
	victim := stream + "-runner"
	defer redistestDelete(admin, stream, stream+"-dead")
	if err := admin.XGroupCreateMkStream(ctx, stream, redisGroup, "0").Err(); err != nil {
		return err
	}
	defer func() {
		dl, err := redisDeadLetters(context.WithoutCancel(ctx), admin, stream+"-dead")
		if err != nil {
			e.soak.log.Error("soak: read the Redis dead letters", "err", err)
		}
		e.deadLettered = dl
	}()
	rdb, err := redisConnect(ctx, redisURL(), victim)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()

	o := e.soak.opts
	pool, inbox, err := e.consumerInbox(ctx, int32(o.workers)*2+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	handler := faultyHandler[*deduperedis.Message](e, nil)

	// Kill the in-process runners' Redis connections, paced by progress.
	defer e.every(ctx, redisCutEvery, faultBrokerCut, func(ctx context.Context) bool {
		n, err := redistest.Kill(ctx, admin, victim)
		return err == nil && n > 0
	})()

	keyless := e.countUnique(e.withoutKey)
	return runExternal(ctx, e, external{
		consumers: 2,
		consume: func(ctx context.Context, n int) error {
			return runRedisRunner(ctx, e, inbox, rdb, stream, fmt.Sprintf("runner-%d", n), handler, o.workers)
		},
		childArgs: []string{"-redis-url", redisURL(), "-redis-stream", stream},
		feed: func(ctx context.Context) error {
			pipe := admin.Pipeline()
			for _, id := range inputs {
				values := []any{"body", id}
				if !e.withoutKey(id) {
					values = append(values, "id", id)
				}
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values})
			}
			if _, err := pipe.Exec(ctx); err != nil && ctx.Err() == nil {
				return fmt.Errorf("xadd: %w", err)
			}
			return nil
		},
		done: func(ctx context.Context) (bool, error) {
			p, err := admin.XPending(ctx, stream, redisGroup).Result()
			if err != nil {
				return false, err
			}
			groups, err := admin.XInfoGroups(ctx, stream).Result()
			if err != nil {
				return false, err
			}
			if p.Count > 0 || len(groups) != 1 || groups[0].Lag != 0 {
				return false, nil
			}
			if n, err := admin.XLen(ctx, stream+"-dead").Result(); err != nil || n < int64(keyless) {
				return false, err
			}
			return e.settledInDB(ctx)
		},
	})
}

// redistestDelete deletes keys, ignoring errors (a cleanup).
func redistestDelete(rdb *redis.Client, keys ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = rdb.Del(ctx, keys...).Err()
}

// redisDeadLetters returns the inputs with a copy in the dead-letter stream
// (the copy keeps the entry's body field, the input's id).
func redisDeadLetters(ctx context.Context, rdb *redis.Client, dl string) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	msgs, err := rdb.XRange(ctx, dl, "-", "+").Result()
	out := map[string]bool{}
	for _, m := range msgs {
		if b, ok := m.Values["body"].(string); ok {
			out[b] = true
		}
	}
	return out, err
}

// runRedisRunner runs one in-process deduperedis.Runner as consumer name
// until ctx ends, counting every handling of an entry delivered more than
// once (reclaimed from a killed worker) as a broker redelivery.
func runRedisRunner(ctx context.Context, e *env, inbox *dedupe.Inbox, rdb *redis.Client, stream, name string,
	h dedupe.HandlerFunc[*deduperedis.Message], workers int) error {
	inbox, err := e.countingRedeliveries(inbox)
	if err != nil {
		return err
	}
	r, err := deduperedis.New(inbox, rdb, stream, redisGroup, redisConfig(e.scope, name, workers, stream), h)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// redisConfig is the runners' configuration: the "id" field as key, short
// delays and idle time, the dead-letter stream <stream>-dead.
func redisConfig(scope, consumer string, workers int, stream string) deduperedis.Config {
	return deduperedis.Config{
		Scope:            scope,
		Consumer:         consumer,
		Workers:          workers,
		ClaimIdle:        redisClaimIdle,
		Block:            200 * time.Millisecond,
		Backoff:          func(int) time.Duration { return 20 * time.Millisecond },
		InFlightDelay:    50 * time.Millisecond,
		DrainTimeout:     2 * time.Second,
		DeadLetterStream: stream + "-dead",
	}
}

// redisChild is the Redis worker subprocess: one runner in the soak's
// group, under a consumer name of its own (each restart is a new
// consumer; the entries a killed one held are reclaimed by the others).
func redisChild(ctx context.Context, e *env, fl *childFlags, say func(verb, arg string)) error {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	rdb, err := redisConnect(ctx, fl.redisURL, "dedupe-soak-child")
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	pool, inbox, err := e.consumerInbox(ctx, 3)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := deduperedis.New(inbox, rdb, fl.redisStream, redisGroup,
		redisConfig(e.scope, "child-"+hex.EncodeToString(rnd[:]), 2, fl.redisStream), childHandler[*deduperedis.Message](e, say))
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
