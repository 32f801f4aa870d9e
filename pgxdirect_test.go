package dedupe_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// TestDirectRoundConnectionLost: the connection breaks in the middle of the
// claim round that a pgx pool sends straight over pgconn, before the claim
// reaches the server (Cut) or after the server ran the round but before its
// answer arrives (DropReply: BEGIN, the claim and the savepoint ran in a
// transaction that never commits). Handle reports a plain failure, nothing
// is committed, the broken connection does not stay acquired, and the
// redelivery claims the key and runs the handler once.
func TestDirectRoundConnectionLost(t *testing.T) {
	t.Parallel()
	for _, action := range []pgproxy.Action{pgproxy.Cut, pgproxy.DropReply} {
		b := setup(t)
		pool, p := faultyPool(t, b, pgproxy.Once(action, runsInsert))
		c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}, insertEffect)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		out, err := c.Handle(ctx, order{ID: "o-round"})
		if err == nil || out == dedupe.OutcomeClaimed || errors.Is(err, dedupe.ErrOutcomeUnknown) {
			t.Fatalf("action %d: handle with the round broken = %v, %v; want a plain failure", action, out, err)
		}
		if p.Stats().Of(action) != 1 {
			t.Fatalf("action %d: the proxy acted %d times, want 1", action, p.Stats().Of(action))
		}
		if got := b.effects(t, "o-round"); got != 0 {
			t.Fatalf("action %d: effects = %d, want 0", action, got)
		}
		if _, err := b.inbox.Lookup(ctx, dedupe.Key{Scope: "orders", ID: "o-round"}); !errors.Is(err, dedupe.ErrNotFound) {
			t.Fatalf("action %d: the key after the broken round: %v, want ErrNotFound", action, err)
		}
		if n := dbtest.SettledAcquired(pool); n != 0 {
			t.Fatalf("action %d: %d connections still acquired", action, n)
		}
		if out, err := c.Handle(ctx, order{ID: "o-round"}); err != nil || out != dedupe.OutcomeClaimed {
			t.Fatalf("action %d: redelivery = %v, %v; want claimed", action, out, err)
		}
		if out, err := c.Handle(ctx, order{ID: "o-round"}); err != nil || out != dedupe.OutcomeDuplicate {
			t.Fatalf("action %d: second redelivery = %v, %v; want duplicate", action, out, err)
		}
		if got := b.effects(t, "o-round"); got != 1 {
			t.Fatalf("action %d: effects = %d, want 1", action, got)
		}
	}
}

// TestDirectRoundPreparesAgain: the direct round's statements are prepared
// once per connection. When they go away on the server (DEALLOCATE ALL) or
// their result type changes (the inbox altered by hand), the round prepares
// them anew, or sends the claim through pgx when the types are no longer the
// ones it encodes; no message fails or runs twice.
func TestDirectRoundPreparesAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one connection: every statement below meets the prepared ones
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The handler's own statement goes as a simple query, so that it does
	// not depend on pgx's statement cache, which DEALLOCATE ALL empties too.
	c, err := dedupe.NewConsumer(newInbox(t, pool, b), dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey},
		func(ctx context.Context, tx pgx.Tx, o order) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) VALUES ($1)", pgx.QueryExecModeSimpleProtocol, o.ID)
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(id string, want dedupe.Outcome) {
		t.Helper()
		if out, err := c.Handle(ctx, order{ID: id}); err != nil || out != want {
			t.Fatalf("handle %s = %v, %v; want %v", id, out, err, want)
		}
	}
	handle("o-1", dedupe.OutcomeClaimed)
	if _, err := pool.Exec(ctx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	handle("o-2", dedupe.OutcomeClaimed)
	handle("o-1", dedupe.OutcomeDuplicate)
	// attempts becomes bigint: the prepared claim's result type changed.
	b.db.Exec(t, "ALTER TABLE dedupe_inbox ALTER COLUMN attempts TYPE bigint")
	handle("o-3", dedupe.OutcomeClaimed)
	handle("o-2", dedupe.OutcomeDuplicate)
	handle("o-3", dedupe.OutcomeDuplicate)
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		if got := b.effects(t, id); got != 1 {
			t.Fatalf("effects of %s = %d, want 1", id, got)
		}
	}
}
