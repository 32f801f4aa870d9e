package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// TestRelayManyRelaysKeepKeyOrderAroundAParkedHead runs five relays with
// small batches and a small scan window while writers commit keyed and
// unkeyed messages concurrently; some publishes fail once, and the first
// message of key "p" is refused for good. Every other message is published
// exactly once, never two of a key in flight, each key in commit order; key
// p waits behind its parked head (none of its later messages goes out) until
// the head is discarded, and then follows in order.
func TestRelayManyRelaysKeepKeyOrderAroundAParkedHead(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	b.outbox, _ = outbox.New(b.db.Pool, outbox.Config{Logger: testLogger(t)})
	rec := newRecorder()
	rec.delay = time.Millisecond
	var failedOnce sync.Map
	rec.setFail(func(m *outbox.StoredMessage) error {
		switch n, _ := strconv.Atoi(string(m.Payload)); {
		case m.Key == "p" && n == 1:
			return dedupe.Permanent(errors.New("refused for good"))
		case n%5 == 0:
			if _, again := failedOnce.LoadOrStore(m.ID, true); !again {
				return errors.New("refused once")
			}
		}
		return nil
	})
	cfg := outbox.RelayConfig{BatchSize: 5, ScanWindow: 12, PollInterval: 20 * time.Millisecond,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	const relays = 5
	for range relays {
		runRelay(t, b.relay(t, rec, cfg))
	}

	keys := []string{"p", "a", "b", "c", "d", "e", "f", "g"}
	b.db.Exec(t, `CREATE TABLE seq (key text PRIMARY KEY, n int NOT NULL)`)
	for _, k := range keys {
		b.db.Exec(t, `INSERT INTO seq VALUES ($1, 0)`, k)
	}
	// p's poison goes first, so that it heads its key.
	b.db.Exec(t, `UPDATE seq SET n = 1 WHERE key = 'p'`)
	b.enqueue(t, outbox.Message{Topic: "t", Key: "p", Payload: []byte("1")})

	const writers, perWriter = 4, 40
	var unkeyed atomic.Int64
	errs := make([]error, writers)
	together(writers, func(w int) {
		for i := range perWriter {
			key := keys[(w*7+i)%len(keys)]
			err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				id, err := b.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: key})
				if err != nil {
					return err
				}
				var n int
				if err := tx.QueryRow(ctx, `UPDATE seq SET n = n + 1 WHERE key = $1 RETURNING n`, key).Scan(&n); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `UPDATE dedupe_outbox SET payload = $2 WHERE message_id = $1`, id, []byte(strconv.Itoa(n)))
				return err
			})
			if err == nil && i%4 == 0 {
				err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					_, err := b.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "t", Payload: []byte("-")})
					return err
				})
				unkeyed.Add(1)
			}
			if err != nil {
				errs[w] = err
				return
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	pHeld := b.db.Count(t, "SELECT n FROM seq WHERE key = 'p'") - 1
	want := writers*perWriter + 1 + int(unkeyed.Load()) - 1 - pHeld // all but p's messages
	published := func(n int) func() bool {
		return func() bool { got, _, _ := rec.snapshot(); return len(got) >= n }
	}
	waitFor(t, 30*time.Second, "every message of the other keys", published(want))
	// p's later messages stay pending behind the parked head.
	waitFor(t, 10*time.Second, "p's head parked", func() bool {
		return b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE key = 'p' AND parked_at IS NOT NULL") == 1
	})
	time.Sleep(100 * time.Millisecond) // let a wrong send of p show up
	check := func(total int) {
		t.Helper()
		got, sends, violations := rec.snapshot()
		if len(violations) > 0 {
			t.Fatalf("violations: %v", violations[:min(len(violations), 5)])
		}
		if len(got) != total || len(sends) != total {
			t.Fatalf("published %d (%d distinct), want %d", len(got), len(sends), total)
		}
		last := map[string]int{"p": 1}
		for _, m := range got {
			if m.Key == "" {
				continue
			}
			n, _ := strconv.Atoi(string(m.Payload))
			if n != last[m.Key]+1 {
				t.Fatalf("key %s: commit position %d published after %d", m.Key, n, last[m.Key])
			}
			last[m.Key] = n
		}
		for _, k := range keys {
			if want := b.db.Count(t, "SELECT n FROM seq WHERE key = $1", k); k != "p" && last[k] != want {
				t.Fatalf("key %s: last published %d of %d", k, last[k], want)
			}
		}
	}
	check(want)

	parked, err := b.outbox.Parked(ctx, 10)
	if err != nil || len(parked) != 1 {
		t.Fatalf("parked = %v, %v", parked, err)
	}
	if _, err := b.outbox.Discard(ctx, parked[0].ID, "test", "refused for good"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("p's %d held messages", pHeld), published(want+pHeld))
	time.Sleep(100 * time.Millisecond)
	check(want + pHeld)
}

// TestRelayFollowersStopAtTheFirstGap: a cycle takes a key's later rows with
// its head only up to the first one that is not due or is parked (written
// here by hand: a relay never leaves a row behind its head so), never past it.
func TestRelayFollowersStopAtTheFirstGap(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	rec := newRecorder()
	relay := b.relay(t, rec, outbox.RelayConfig{})
	for _, gap := range []string{
		"next_attempt_at = next_attempt_at + interval '1 hour'",
		"parked_at = next_attempt_at",
	} {
		ids := b.enqueue(t, outbox.Message{Topic: "t", Key: "a"}, outbox.Message{Topic: "t", Key: "a"},
			outbox.Message{Topic: "t", Key: "a"}, outbox.Message{Topic: "t", Key: "b"})
		b.db.Exec(t, "UPDATE dedupe_outbox SET "+gap+" WHERE message_id = $1", ids[1])
		if n := cycle(t, relay); n != 2 {
			t.Fatalf("gap %q: published %d, want the head of a and b", gap, n)
		}
		if n := cycle(t, relay); n != 0 {
			t.Fatalf("gap %q: published %d past the gap", gap, n)
		}
		b.db.Exec(t, "DELETE FROM dedupe_outbox")
	}
}

// TestRelayCursorComesBackForEarlierRows: after the relay's window moved
// past a blocked backlog, a row before it that becomes claimable (here an
// unparked message) is published within a few cycles, although new messages
// keep arriving after the window.
func TestRelayCursorComesBackForEarlierRows(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	rec := newRecorder()
	var poison atomic.Bool
	poison.Store(true)
	rec.setFail(func(m *outbox.StoredMessage) error {
		if string(m.Payload) == "poison" && poison.Load() {
			return dedupe.Permanent(errors.New("not yet"))
		}
		return nil
	})
	relay := b.relay(t, rec, outbox.RelayConfig{BatchSize: 2, ScanWindow: 3})
	msgs := []outbox.Message{{Topic: "t", Key: "p", Payload: []byte("poison")}}
	for i := range 6 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: "p", Payload: []byte(fmt.Sprint("p", i))})
	}
	ids := b.enqueue(t, msgs...)
	for i := range 4 {
		b.enqueue(t, outbox.Message{Topic: "t", Key: fmt.Sprint("r", i), Payload: []byte(fmt.Sprint("r", i))})
		cycle(t, relay)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL"); n != 1 {
		t.Fatalf("parked = %d", n)
	}
	poison.Store(false)
	if err := b.outbox.Unpark(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		b.enqueue(t, outbox.Message{Topic: "t", Key: fmt.Sprint("s", i), Payload: []byte(fmt.Sprint("s", i))})
		cycle(t, relay)
	}
	if _, sends, _ := rec.snapshot(); sends[ids[0]] != 1 {
		t.Fatalf("the unparked message was not published in 6 cycles while new messages kept coming")
	}
}
