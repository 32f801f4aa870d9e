package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/redistest"
)

// childEnv makes TestMain run the program's main, for the SIGTERM test.
const childEnv = "DEDUPE_REDIS_CONSUMER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Args = os.Args[:1]
		main()
		os.Exit(0)
	}
	dbtest.VerifyTestMain(m)
}

// env returns the program's environment for a fresh schema and stream.
func env(t *testing.T, db *dbtest.DB, stream string) map[string]string {
	return map[string]string{
		"REDIS_URL": redistest.URL(), "DATABASE_URL": db.URL, "REDIS_STREAM": stream,
		"WORKERS": "2", "CLAIM_IDLE": "2s",
	}
}

func add(t *testing.T, rdb *redis.Client, stream string, fields ...any) {
	t.Helper()
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: fields}).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestTwoCopiesShipEachOrderOnce runs two copies of the program on one
// stream and group, adds every order twice (a producer's retry) and an
// entry that is no order, and counts: one shipment per order, one dead
// letter, nothing pending.
func TestTwoCopiesShipEachOrderOnce(t *testing.T) {
	db := dbtest.New(t)
	rdb := redistest.Client(t)
	stream := redistest.Stream(t, rdb, "orders")
	t.Cleanup(func() { redistest.Delete(rdb, stream+"-dead") })
	e := env(t, db, stream)
	cfg, err := configFromEnv(func(name string) string { return e[name] })
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	ready := make(chan error, 2)
	for range 2 {
		c := cfg
		var once sync.Once
		c.ready = func() { once.Do(func() { ready <- nil }) }
		dbtest.Background(t, "redis-consumer", func(ctx context.Context) error {
			err := run(ctx, c)
			once.Do(func() { ready <- fmt.Errorf("stopped before it started: %v", err) })
			return err
		})
	}
	for range 2 {
		if err := <-ready; err != nil {
			t.Fatal(err)
		}
	}
	const orders = 20
	for i := range orders {
		for range 2 {
			add(t, rdb, stream, "id", fmt.Sprintf("order-%d", i), "item", "book", "qty", "1")
		}
	}
	add(t, rdb, stream, "id", "order-bad", "item", "book", "qty", "many")
	dbtest.WaitFor(t, 30*time.Second, "the orders shipped and the bad one dead-lettered", func() bool {
		n, _ := rdb.XLen(context.Background(), stream+"-dead").Result()
		return db.Count(t, "SELECT count(*) FROM shipments") >= orders && n == 1
	})
	dbtest.WaitFor(t, 10*time.Second, "nothing pending", func() bool {
		p, err := rdb.XPending(context.Background(), stream, "shipping").Result()
		return err == nil && p.Count == 0
	})
	if n := db.Count(t, "SELECT count(*) FROM shipments"); n != orders {
		t.Fatalf("shipments = %d, want %d", n, orders)
	}
	if n := db.Count(t, "SELECT count(DISTINCT order_id) FROM shipments"); n != orders {
		t.Fatalf("distinct orders shipped = %d, want %d", n, orders)
	}
	if n := db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'order-bad' AND state = 'failed'"); n != 1 {
		t.Fatalf("the bad order is not recorded failed")
	}
}

// TestSIGTERMDrainsExitZero runs the program as a process, with an order
// in its handler when SIGTERM comes: it commits it, acknowledges it and
// exits 0.
func TestSIGTERMDrainsExitZero(t *testing.T) {
	db := dbtest.New(t)
	rdb := redistest.Client(t)
	stream := redistest.Stream(t, rdb, "orders")
	t.Cleanup(func() { redistest.Delete(rdb, stream+"-dead") })
	// Hold every shipment's insert until SIGTERM was sent: a lock the
	// test holds on the table, taken once the program created it.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	for k, v := range env(t, db, stream) {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	dbtest.WaitFor(t, 60*time.Second, "the group created", func() bool {
		groups, err := rdb.XInfoGroups(context.Background(), stream).Result()
		return err == nil && len(groups) == 1
	})
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE shipments IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	add(t, rdb, stream, "id", "order-1", "item", "book", "qty", "2")
	dbtest.WaitFor(t, 20*time.Second, "the order in the handler", func() bool {
		p, err := rdb.XPending(ctx, stream, "shipping").Result()
		return err == nil && p.Count == 1
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	_ = tx.Rollback(ctx) // the insert goes on and commits within the drain
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("exit: %v, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("did not exit within 30s of SIGTERM")
	}
	if n := db.Count(t, "SELECT count(*) FROM shipments WHERE order_id = 'order-1' AND qty = 2"); n != 1 {
		t.Fatalf("shipments of order-1 = %d, want 1", n)
	}
	if p, err := rdb.XPending(ctx, stream, "shipping").Result(); err != nil || p.Count != 0 {
		t.Fatalf("pending after the drain = %v (%v), want 0", p, err)
	}
}
