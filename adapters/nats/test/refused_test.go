package test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// TestRefusedWithoutDeadLetterRecordedFailed: without a dead-letter subject,
// a message without a key and one whose key was used with another payload
// are recorded failed in the inbox under RefusedKey, as the Kafka runner
// records them, before they are terminated: every message ends in one
// visible state (they were only logged before).
func TestRefusedWithoutDeadLetterRecordedFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := observetest.New()
	cfg := fastConfig()
	cfg.Fingerprint = func(msg jetstream.Msg) []byte { s := sha256.Sum256(msg.Data()); return s[:] }
	dbtest.Background(t, "runner", newRunner(t, b.observed(t, c), b.cons, cfg, nil).Run)

	seqs := map[string]uint64{} // what each message is, by its stream sequence
	publish := func(what, orderID, body string) {
		m := nats.NewMsg("orders.created")
		m.Header.Set(jetstream.MsgIDHeader, what)
		if orderID != "" {
			m.Header.Set(orderIDHdr, orderID)
		}
		m.Data = []byte(body)
		ack, err := b.js.PublishMsg(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		seqs[what] = ack.Sequence
	}
	publish("keyless", "", "no order id")
	publish("first", "order-1", "book")
	c.Wait(t, 10*time.Second, "order-1 processed", func() bool { return b.effects(t) == 1 })
	publish("conflict", "order-1", "another book")
	c.Wait(t, 10*time.Second, "both refused messages terminated", func() bool {
		return c.Events(dedupe.EventTerminated) == 2 && b.unacked(t) == 0
	})
	if c.Events(dedupe.EventRefused) != 2 || b.effects(t) != 1 {
		t.Fatalf("observed %s, effects %d; want 2 refused, 1 effect", c, b.effects(t))
	}

	// The records, as dedupe inspect shows them: one failed key per refused
	// message, named after its stream sequence, with the reason.
	rows, err := b.db.Pool.Query(context.Background(), `SELECT key FROM dedupe_inbox WHERE scope = $1 AND key LIKE $2 ORDER BY key`,
		durable, dedupenats.RefusedKeyPrefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if rows.Err() != nil || len(keys) != 2 {
		t.Fatalf("refused keys = %q (%v), want 2", keys, rows.Err())
	}
	for what, reason := range map[string]string{"keyless": "no usable key", "conflict": "different payload"} {
		prefix := fmt.Sprintf("%s%s/%d/", dedupenats.RefusedKeyPrefix, streamName, seqs[what])
		var key string
		for _, k := range keys {
			if strings.HasPrefix(k, prefix) {
				key = k
			}
		}
		if key == "" {
			t.Fatalf("no refused key for the %s message (%s...): %q", what, prefix, keys)
		}
		rec, err := b.inbox.Lookup(context.Background(), dedupe.Key{Scope: durable, ID: key})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != dedupe.StateFailed || !strings.Contains(rec.LastError, reason) {
			t.Errorf("%s message: %s is %s with last error %q, want failed with %q", what, key, rec.State, rec.LastError, reason)
		}
	}
	// The key that completed is left as it was.
	if rec, err := b.inbox.Lookup(context.Background(), dedupe.Key{Scope: durable, ID: "order-1"}); err != nil || rec.State != dedupe.StateComplete {
		t.Fatalf("order-1 = %+v, %v; want complete", rec, err)
	}
}

// TestRefusedKeyShape: the key names the stream, sequence and store time,
// and stays within the key length limit for a long stream name.
func TestRefusedKeyShape(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	if _, err := b.js.Publish(context.Background(), "orders.created", []byte("x")); err != nil {
		t.Fatal(err)
	}
	batch, err := b.cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		meta, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("dedupenats-refused/%s/%d/%d", streamName, meta.Sequence.Stream, meta.Timestamp.UnixMilli())
		if got := dedupenats.RefusedKey(msg); got != want {
			t.Fatalf("RefusedKey = %q, want %q", got, want)
		}
		if err := (dedupe.Key{Scope: durable, ID: dedupenats.RefusedKey(msg)}).Validate(); err != nil {
			t.Fatal(err)
		}
		_ = msg.Ack()
	}
}

// TestRefusedNotTerminatedUntilRecorded: without a dead-letter subject, a
// refused message the database cannot record yet (its inbox table locked,
// as an outage would leave it) is naked and comes back, never terminated
// unseen; once the database answers it is recorded and terminated.
func TestRefusedNotTerminatedUntilRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := observetest.New()
	cfg := fastConfig()
	cfg.AckTimeout = 300 * time.Millisecond // one try to record
	ctx := context.Background()
	lock, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, "LOCK TABLE dedupe_inbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	dbtest.Background(t, "runner", newRunner(t, b.observed(t, c), b.cons, cfg, nil).Run)
	if _, err := b.js.Publish(ctx, "orders.created", []byte("no order id")); err != nil {
		t.Fatal(err)
	}
	c.Wait(t, 20*time.Second, "two tries to record the refused message", func() bool {
		return c.Events(dedupe.EventRefused) >= 2
	})
	if n := c.Events(dedupe.EventTerminated); n != 0 {
		t.Fatalf("the refused message was terminated %d times while it could not be recorded (observed %s)", n, c)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	c.Wait(t, 20*time.Second, "the refused message recorded and terminated", func() bool {
		return c.Events(dedupe.EventTerminated) == 1 && b.unacked(t) == 0
	})
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key LIKE $1 AND state = 'failed'", dedupenats.RefusedKeyPrefix+"%"); n != 1 {
		t.Fatalf("refused records = %d, want 1", n)
	}
}
