package dedupe_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// writeCounter counts the writes to a connection's socket: a pgx round
// trip is one write.
type writeCounter struct {
	net.Conn
	n *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// TestHandleBatchRoundTrips: over pgx, a batch of new keys costs BEGIN, the
// claim with the savepoint the checked COMMIT releases (one round trip),
// the handler's statements and the COMMIT: the check of the COMMIT costs no
// round trip, with a per-message handler or a batch handler.
func TestHandleBatchRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var writes atomic.Int64
	pool := directPool(t, b, 1, func(c *pgxpool.Config) {
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeCounter{conn, &writes}, nil
		}
	})
	inbox := newInbox(t, pool, b)
	cfg := dedupe.ConsumerConfig[order]{Scope: "orders", Key: orderKey}
	each, err := dedupe.NewBatchConsumer(inbox, cfg, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	all, err := dedupe.NewBatchConsumerFunc(inbox, cfg, func(ctx context.Context, tx pgx.Tx, msgs []order) error {
		ids := make([]string, len(msgs))
		for n, m := range msgs {
			ids[n] = m.ID
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects (msg_key) SELECT unnest($1::text[])", ids)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	const size = 10
	batch := func(prefix string, round int) []order {
		msgs := make([]order, size)
		for n := range msgs {
			msgs[n] = order{ID: fmt.Sprintf("%s-%d-%02d", prefix, round, n)}
		}
		return msgs
	}
	for _, tc := range []struct {
		name string
		c    *dedupe.BatchConsumer[order]
		want int64 // BEGIN, claim + savepoint, the handler's statements, COMMIT
	}{{"per-message", each, 1 + 1 + size + 1}, {"batch-handler", all, 1 + 1 + 1 + 1}} {
		for round := range 3 { // the first prepares the statements
			writes.Store(0)
			for n, r := range tc.c.HandleBatch(context.Background(), batch(tc.name, round)) {
				if r.Err != nil || r.Outcome != dedupe.OutcomeClaimed {
					t.Fatalf("%s: message %d = %v, %v", tc.name, n, r.Outcome, r.Err)
				}
			}
			if got := writes.Load(); round > 0 && got != tc.want {
				t.Errorf("%s: a batch of %d new keys took %d round trips, want %d", tc.name, size, got, tc.want)
			}
		}
	}
}
