package dedupe_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// faultyPool is a pool whose connections pass through a protocol proxy
// that applies the test's policy.
func faultyPool(t *testing.T, b *bundle, policy pgproxy.Policy) (*pgxpool.Pool, *pgproxy.Proxy) {
	t.Helper()
	return dbtest.ProxyPool(t, b.db.URL, policy)
}

// runsInsert matches the execution of the inbox's claim insert.
func runsInsert(ev pgproxy.Event) bool {
	return ev.Runs && strings.HasPrefix(strings.TrimSpace(ev.Query), "INSERT INTO") && strings.Contains(ev.Query, "dedupe_inbox")
}

// runsUpdate matches the execution of an update of the inbox (Complete).
func runsUpdate(ev pgproxy.Event) bool {
	return ev.Runs && strings.HasPrefix(strings.TrimSpace(ev.Query), "UPDATE") && strings.Contains(ev.Query, "dedupe_inbox")
}

func newInbox(t *testing.T, db dedupe.DB, b *bundle) *dedupe.Inbox {
	t.Helper()
	c := b.inbox.Config()
	inbox, err := dedupe.New(db, c)
	if err != nil {
		t.Fatal(err)
	}
	return inbox
}

// TestHandleLostCommitReplyIsResolvedAsCommitted: the COMMIT reached the
// server and its reply was dropped. Handle must not report a rollback (a
// caller would compensate for work that happened); it learns on a fresh
// connection that the claim committed and reports it processed. Before, it
// returned an error that said nothing was committed.
func TestHandleLostCommitReplyIsResolvedAsCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, p := faultyPool(t, b, pgproxy.Once(pgproxy.DropReply, pgproxy.IsCommit))
	c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out, err := c.Handle(ctx, order{ID: "o-lost"})
	if err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("handle with a lost commit reply = %v, %v; want claimed", out, err)
	}
	if p.Stats().DroppedReplys != 1 {
		t.Fatalf("the proxy dropped %d replies, want 1", p.Stats().DroppedReplys)
	}
	if got := b.effects(t, "o-lost"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	if out, err := c.Handle(ctx, order{ID: "o-lost"}); err != nil || out != dedupe.OutcomeDuplicate {
		t.Fatalf("redelivery = %v, %v; want duplicate", out, err)
	}
}

// TestHandleCommitNeverSentIsResolvedAsNotCommitted: the connection broke
// before the COMMIT reached the server. Handle reports an error (nothing
// committed, not an unknown outcome), and the redelivery does the work once.
func TestHandleCommitNeverSentIsResolvedAsNotCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, _ := faultyPool(t, b, pgproxy.Once(pgproxy.Cut, pgproxy.IsCommit))
	c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out, err := c.Handle(ctx, order{ID: "o-cut"})
	if err == nil || out == dedupe.OutcomeClaimed || errors.Is(err, dedupe.ErrOutcomeUnknown) {
		t.Fatalf("handle with the commit cut = %v, %v; want a plain failure", out, err)
	}
	if got := b.effects(t, "o-cut"); got != 0 {
		t.Fatalf("effects = %d, want 0", got)
	}
	if out, err := c.Handle(ctx, order{ID: "o-cut"}); err != nil || out != dedupe.OutcomeClaimed {
		t.Fatalf("redelivery = %v, %v; want claimed", out, err)
	}
	if got := b.effects(t, "o-cut"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// TestCompleteWithLostReplySucceeds: Complete's reply is lost after the
// server applied it. Sent again with the same claim it finds its own token
// and succeeds; before, it reported ErrLeaseLost for its own success.
func TestCompleteWithLostReplySucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, p := faultyPool(t, b, pgproxy.Once(pgproxy.DropReply, runsUpdate))
	inbox := newInbox(t, pool, b)
	ctx := context.Background()
	key := dedupe.Key{Scope: "jobs", ID: "complete-lost"}
	c, err := inbox.Begin(ctx, key)
	if err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin = %+v, %v", c, err)
	}
	if err := inbox.Complete(ctx, c, dedupe.Result{Status: 7, Body: []byte("done")}); err != nil {
		t.Fatalf("complete with a lost reply = %v", err)
	}
	if p.Stats().DroppedReplys != 1 {
		t.Fatalf("dropped %d replies, want 1", p.Stats().DroppedReplys)
	}
	rec, err := b.inbox.Lookup(ctx, key)
	if err != nil || rec.State != dedupe.StateComplete || rec.Result == nil || string(rec.Result.Body) != "done" {
		t.Fatalf("record = %+v, %v", rec, err)
	}
	// A retry by the caller is idempotent too.
	if err := inbox.Complete(ctx, c, dedupe.Result{Status: 7, Body: []byte("done")}); err != nil {
		t.Fatalf("complete again = %v", err)
	}
}

// TestBeginWithLostReplyHoldsTheKey: Begin's insert committed and its reply
// was lost. Before, the key stayed blocked for a whole lease and the retry
// was told someone else held it; now Begin sends the claim again with the
// same token and holds the key.
func TestBeginWithLostReplyHoldsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, p := faultyPool(t, b, pgproxy.Once(pgproxy.DropReply, runsInsert))
	inbox := newInbox(t, pool, b)
	ctx := context.Background()
	key := dedupe.Key{Scope: "jobs", ID: "begin-lost"}
	c, err := inbox.Begin(ctx, key)
	if err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("begin with a lost reply = %+v, %v; want claimed", c, err)
	}
	if p.Stats().DroppedReplys != 1 {
		t.Fatalf("dropped %d replies, want 1", p.Stats().DroppedReplys)
	}
	if err := inbox.Complete(ctx, c, dedupe.Result{}); err != nil {
		t.Fatalf("complete = %v", err)
	}
	if rec, err := b.inbox.Lookup(ctx, key); err != nil || rec.State != dedupe.StateComplete || rec.Attempts != 1 {
		t.Fatalf("record = %+v, %v; want complete after one attempt", rec, err)
	}
}

// TestResolveAfterLostCommitOfCallersTransaction: a caller of Claim that
// commits its own transaction resolves a lost COMMIT reply with Resolve.
func TestResolveAfterLostCommitOfCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, _ := faultyPool(t, b, pgproxy.Once(pgproxy.DropReply, pgproxy.IsCommit))
	inbox := newInbox(t, pool, b)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := inbox.Claim(ctx, tx, dedupe.Key{Scope: "orders", ID: "o-own"})
	if err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("claim = %+v, %v", c, err)
	}
	if err := insertEffect(ctx, tx, order{ID: "o-own"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("commit with a dropped reply returned nil")
	}
	committed, err := inbox.Resolve(ctx, c)
	if err != nil || !committed {
		t.Fatalf("resolve = %v, %v; want committed", committed, err)
	}
	// A claim that never committed resolves as not committed.
	tx2, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := b.inbox.Claim(ctx, tx2, dedupe.Key{Scope: "orders", ID: "o-rolled"})
	if err != nil {
		t.Fatal(err)
	}
	_ = tx2.Rollback(ctx)
	if committed, err := b.inbox.Resolve(ctx, c2); err != nil || committed {
		t.Fatalf("resolve of a rolled-back claim = %v, %v; want false", committed, err)
	}
}

// TestResolveWaitsForATransactionStillHoldingTheKey: the probe waits for a
// transaction that holds the key (its COMMIT not yet processed) instead of
// reading "absent" and calling it a rollback.
func TestResolveWaitsForATransactionStillHoldingTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	c, err := b.inbox.Claim(ctx, tx, dedupe.Key{Scope: "orders", ID: "o-slow"})
	if err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("claim = %+v, %v", c, err)
	}
	type answer struct {
		committed bool
		err       error
	}
	resolver := newInbox(t, b.db.AppPool(t, "resolver", 2), b)
	got := make(chan answer, 1)
	go func() {
		committed, err := resolver.Resolve(ctx, c)
		got <- answer{committed, err}
	}()
	// The probe waits for the open transaction.
	dbtest.WaitFor(t, 30*time.Second, "the probe to wait on the open transaction", func() bool {
		return b.db.Count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'resolver' AND wait_event_type = 'Lock'`) > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-got; a.err != nil || !a.committed {
		t.Fatalf("resolve = %v, %v; want committed", a.committed, a.err)
	}
}
