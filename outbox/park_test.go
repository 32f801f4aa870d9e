package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// TestOutboxDiscardUnblocksTheKeyAndKeepsTheRecord: a parked message holds
// its key; Discard drops it with who, when and why stored in its row, and
// the key's later messages go out in order.
func TestOutboxDiscardUnblocksTheKeyAndKeepsTheRecord(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	rec := newRecorder()
	rec.setFail(func(m *outbox.StoredMessage) error {
		if string(m.Payload) == "poison" {
			return dedupe.Permanent(errors.New("schema registry says no"))
		}
		return nil
	})
	relay := b.relay(t, rec, outbox.RelayConfig{})
	ids := b.enqueue(t,
		outbox.Message{Topic: "t", Key: "a", Payload: []byte("poison")},
		outbox.Message{Topic: "t", Key: "a", Payload: []byte("a2")},
		outbox.Message{Topic: "t", Key: "a", Payload: []byte("a3")})
	if n := cycle(t, relay); n != 0 {
		t.Fatalf("published %d past the poison", n)
	}
	if _, err := b.outbox.Discard(ctx, ids[1], "ops", "not parked"); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("discard of a pending, unparked message = %v, want ErrNotFound", err)
	}
	if _, err := b.outbox.Discard(ctx, ids[0], "", "why"); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("discard without who = %v", err)
	}
	if _, err := b.outbox.Discard(ctx, ids[0], "alice", ""); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("discard without why = %v", err)
	}
	if n := cycle(t, relay); n != 0 {
		t.Fatalf("the parked key published %d", n)
	}

	d, err := b.outbox.Discard(ctx, ids[0], "alice", "INC-42: the order was cancelled by hand")
	if err != nil {
		t.Fatal(err)
	}
	if d.ID != ids[0] || string(d.Payload) != "poison" || d.DiscardedBy != "alice" || d.DiscardedAt.IsZero() ||
		d.LastError == "" || d.Attempt != 1 {
		t.Fatalf("discarded = %+v", d)
	}
	if _, err := b.outbox.Discard(ctx, ids[0], "alice", "again"); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("second discard = %v, want ErrNotFound", err)
	}
	if err := b.outbox.Unpark(ctx, ids[0]); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("unpark of a discarded message = %v, want ErrNotFound", err)
	}
	if n := b.db.Count(t, `SELECT count(*) FROM dedupe_outbox WHERE message_id = $1 AND discarded_by = 'alice'
		AND discard_reason = 'INC-42: the order was cancelled by hand' AND discarded_at = published_at`, ids[0]); n != 1 {
		t.Fatal("the discard is not recorded in the row")
	}
	if st, err := b.outbox.Stats(ctx); err != nil || st.Parked != 0 || st.Pending != 2 {
		t.Fatalf("stats = %+v, %v", st, err)
	}
	if p, err := b.outbox.Parked(ctx, 10); err != nil || len(p) != 0 {
		t.Fatalf("parked = %v, %v", p, err)
	}
	if n := cycle(t, relay); n != 2 {
		t.Fatalf("after discard published %d, want a2 a3", n)
	}
	got, sends, _ := rec.snapshot()
	if len(got) != 2 || string(got[0].Payload)+" "+string(got[1].Payload) != "a2 a3" || sends[ids[0]] != 0 {
		t.Fatalf("published %v", got)
	}
	// The record goes with the relay's retention, like a published row.
	b.clock.Advance(25 * time.Hour)
	if n, err := relay.Cleanup(ctx); err != nil || n != 3 {
		t.Fatalf("cleanup = %d, %v", n, err)
	}
}
