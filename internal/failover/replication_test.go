package failover

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) take() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.b.Reset()
	return s.b.String()
}

// TestFailoverSynchronousCommitPerConsumer: on a server whose own
// synchronous_commit is local (its commits do not wait for the standby
// named in synchronous_standby_names), ConsumerConfig.SynchronousCommit
// makes the claim's COMMIT wait for the standby: with the standby down it
// waits (SyncRep), and completes once the standby streams again; a consumer
// without it commits at once. CheckReplication warns of the consumer whose
// acks may be lost and not of the other, and warns of both once
// synchronous_standby_names is emptied.
func TestFailoverSynchronousCommitPerConsumer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := Start(t, Options{Sync: true, SyncCommit: "local"})
	setupSchema(t, c)
	var logs syncBuffer
	pool := newPool(t, c.URL(), 4)
	inbox, err := dedupe.New(pool, dedupe.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	newCons := func(scope, syncCommit string) *dedupe.Consumer[string] {
		cons, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{Scope: scope, SynchronousCommit: syncCommit,
			Key: func(s string) (string, error) { return s, nil }},
			func(ctx context.Context, tx pgx.Tx, id string) error { return insertEffect(ctx, tx, id) })
		if err != nil {
			t.Fatal(err)
		}
		return cons
	}
	local, durable := newCons("local", ""), newCons("durable", "remote_apply")

	check := func(name string, cons *dedupe.Consumer[string], wantLost bool) {
		t.Helper()
		r, err := cons.CheckReplication(ctx)
		if err != nil {
			t.Fatal(err)
		}
		warned := strings.Contains(logs.take(), "replication is asynchronous")
		if r.Standbys != 1 || r.AckMayBeLost() != wantLost || warned != wantLost {
			t.Fatalf("%s: CheckReplication = %+v, ack may be lost %v, warned %v; want 1 standby, %v, %v",
				name, r, r.AckMayBeLost(), warned, wantLost, wantLost)
		}
	}
	check("server default local", local, true)
	check("SynchronousCommit remote_apply", durable, false)

	c.StopStandby()
	if out, err := local.Handle(ctx, "a"); err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("local commit without a standby = %v, %v", out, err)
	}
	type result struct {
		out dedupe.Outcome
		err error
	}
	res := make(chan result, 1)
	go func() {
		out, err := durable.Handle(ctx, "b")
		res <- result{out, err}
	}()
	// The durable consumer's COMMIT waits for the standby.
	direct, err := pgx.Connect(ctx, c.PrimaryURL())
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.WithoutCancel(ctx))
	for {
		var waiting int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case r := <-res:
			t.Fatalf("the claim with SynchronousCommit remote_apply committed (%v, %v) without its standby", r.out, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	c.StartStandby()
	if r := <-res; r.err != nil || r.out != dedupe.OutcomeClaimed {
		t.Fatalf("the waiting claim once the standby streams = %v, %v", r.out, r.err)
	}

	// Without a synchronous standby named, nothing waits: both warn.
	if _, err := direct.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = ''`); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	for {
		var names string
		if err := pool.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		if names == "" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	check("no synchronous standby, local", local, true)
	check("no synchronous standby, remote_apply", durable, true)
}
