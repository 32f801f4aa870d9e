package test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/redistest"
)

const group = "billing"

// bundle is what setup gives each test: a fresh schema with an effects
// table, an inbox, a Redis client and a stream of its own.
type bundle struct {
	db     *dbtest.DB
	inbox  *dedupe.Inbox
	rdb    *redis.Client
	stream string
}

func setup(t *testing.T, db *dbtest.DB) *bundle {
	t.Helper()
	b := &bundle{db: db}
	if b.db == nil {
		b.db = dbtest.New(t)
	}
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, b.db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	b.db.Exec(t, `CREATE TABLE IF NOT EXISTS effects (id bigserial PRIMARY KEY, msg_id text NOT NULL, body bytea)`)
	inbox, err := dedupe.New(b.db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b.inbox = inbox
	b.rdb = redistest.Client(t)
	b.stream = redistest.Stream(t, b.rdb, "orders")
	return b
}

// observed returns b with an inbox of its own, over the same schema, whose
// Observer is obs.
func (b *bundle) observed(t *testing.T, obs dedupe.Observer) *bundle {
	t.Helper()
	inbox, err := dedupe.New(b.db.Pool, dedupe.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	o := *b
	o.inbox = inbox
	return &o
}

// publish adds an entry with the business key id and body.
func (b *bundle) publish(t testing.TB, id, body string) string {
	t.Helper()
	eid, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: []any{"id", id, "body", body}}).Result()
	if err != nil {
		t.Fatalf("xadd %s: %v", id, err)
	}
	return eid
}

func (b *bundle) effects(t *testing.T) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM effects")
}

// pending is how many entries the group has delivered and not seen
// acknowledged.
func (b *bundle) pending(t *testing.T) int64 {
	t.Helper()
	p, err := b.rdb.XPending(context.Background(), b.stream, group).Result()
	if err != nil {
		t.Fatalf("xpending: %v", err)
	}
	return p.Count
}

// unread is how many entries the group has not delivered yet (its lag).
func (b *bundle) unread(t *testing.T) int64 {
	t.Helper()
	groups, err := b.rdb.XInfoGroups(context.Background(), b.stream).Result()
	if err != nil {
		t.Fatalf("xinfo groups: %v", err)
	}
	for _, g := range groups {
		if g.Name == group {
			return g.Lag
		}
	}
	t.Fatalf("group %s not found on %s", group, b.stream)
	return 0
}

// insertEffect is the test handler's effect: one row per processed entry.
func insertEffect(ctx context.Context, tx pgx.Tx, msg *deduperedis.Message) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (msg_id, body) VALUES ($1, $2)",
		dedupe.ClaimFromContext(ctx).Key.ID, msg.Field("body"))
	return err
}

// fastConfig is a Config for tests: short delays and idle times.
func fastConfig(t *testing.T) deduperedis.Config {
	return deduperedis.Config{
		Consumer:  redistest.Name("c"),
		Backoff:   func(int) time.Duration { return 20 * time.Millisecond },
		ClaimIdle: 2 * time.Second,
		Block:     100 * time.Millisecond,
		Logger:    testLogger(t),
	}
}

func newRunner(t *testing.T, b *bundle, rdb *redis.Client, cfg deduperedis.Config, h dedupe.HandlerFunc[*deduperedis.Message]) *deduperedis.Runner {
	t.Helper()
	if h == nil {
		h = insertEffect
	}
	if rdb == nil {
		rdb = b.rdb
	}
	r, err := deduperedis.New(b.inbox, rdb, b.stream, group, cfg, h)
	if err != nil {
		t.Fatalf("new runner: %v", err)
	}
	return r
}

// run runs r in the background until the test ends or stop is called.
func run(t *testing.T, r *deduperedis.Runner) (stop func()) {
	t.Helper()
	return dbtest.Background(t, "runner "+r.Config().Consumer, r.Run)
}

// deadLetters returns the entries of the dead-letter stream dl.
func deadLetters(t *testing.T, rdb *redis.Client, dl string) []redis.XMessage {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), dl, "-", "+").Result()
	if err != nil {
		t.Fatalf("xrange %s: %v", dl, err)
	}
	return msgs
}

// readAsDead reads up to n new entries as the consumer "dead", which never
// acknowledges them, as a consumer that crashed would.
func (b *bundle) readAsDead(t *testing.T, n int) []redis.XMessage {
	t.Helper()
	ctx := context.Background()
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, group, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		t.Fatal(err)
	}
	res, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "dead", Streams: []string{b.stream, ">"}, Count: int64(n), Block: -1,
	}).Result()
	if err != nil {
		t.Fatalf("xreadgroup as dead: %v", err)
	}
	if len(res) != 1 || len(res[0].Messages) != n {
		t.Fatalf("read as dead: %v, want %d entries", res, n)
	}
	return res[0].Messages
}

// testLogger logs through t.Log, shown only when the test fails (or -v).
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// ids returns n keys with prefix.
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}
