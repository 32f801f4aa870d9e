package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// recorder is an in-memory broker for the transport-neutral relay tests: it
// confirms every message (unless told to fail), records what arrived in
// order, and flags a key that has two messages in flight at once.
type recorder struct {
	mu         sync.Mutex
	got        []*outbox.StoredMessage
	sends      map[string]int // message ID → times published
	inFlight   map[string]int // topic/key → messages being published
	violations []string
	fail       func(m *outbox.StoredMessage) error // nil: confirm
	delay      time.Duration
	after      func() // runs after each confirmed batch (fault injection)
}

func newRecorder() *recorder {
	return &recorder{sends: map[string]int{}, inFlight: map[string]int{}}
}

func (r *recorder) Publish(ctx context.Context, msgs []*outbox.StoredMessage) []error {
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() {
			k := m.Topic + "/" + m.Key
			r.mu.Lock()
			if m.Key != "" {
				r.inFlight[k]++
				if r.inFlight[k] > 1 {
					r.violations = append(r.violations, "two in flight for "+k)
				}
			}
			fail := r.fail
			r.mu.Unlock()
			if r.delay > 0 {
				time.Sleep(r.delay)
			}
			var err error
			if fail != nil {
				err = fail(m)
			}
			r.mu.Lock()
			if m.Key != "" {
				r.inFlight[k]--
			}
			if err == nil {
				r.got = append(r.got, m)
				r.sends[m.ID]++
			}
			r.mu.Unlock()
			errs[i] = err
		})
	}
	wg.Wait()
	if r.after != nil {
		r.after()
	}
	return errs
}

func (r *recorder) setFail(f func(m *outbox.StoredMessage) error) {
	r.mu.Lock()
	r.fail = f
	r.mu.Unlock()
}

func (r *recorder) snapshot() (got []*outbox.StoredMessage, sends map[string]int, violations []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sends = map[string]int{}
	for k, v := range r.sends {
		sends[k] = v
	}
	return append([]*outbox.StoredMessage(nil), r.got...), sends, append([]string(nil), r.violations...)
}

// outboxBundle is the setup of the outbox tests.
type outboxBundle struct {
	*bundle
	outbox *outbox.Outbox
}

func setupOutbox(t *testing.T) *outboxBundle {
	t.Helper()
	b := setup(t)
	ob, err := outbox.New(b.db.Pool, outbox.Config{Clock: b.clock.Now, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &outboxBundle{bundle: b, outbox: ob}
}

func (b *outboxBundle) relay(t *testing.T, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	r, err := outbox.NewRelay(b.outbox, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// enqueue commits one transaction with msgs.
func (b *outboxBundle) enqueue(t *testing.T, msgs ...outbox.Message) []string {
	t.Helper()
	var ids []string
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		for _, m := range msgs {
			id, err := b.outbox.Enqueue(context.Background(), tx, m)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return ids
}

// testLogger logs through t, so a test's relay logs show only when it fails.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func cycle(t *testing.T, r *outbox.Relay) int {
	t.Helper()
	n, err := r.Cycle(context.Background())
	if err != nil {
		t.Fatalf("cycle: %v", err)
	}
	return n
}

func TestOutboxRolledBackPublishesNothingCommittedOnce(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	rec := newRecorder()
	relay := b.relay(t, rec, outbox.RelayConfig{})

	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Payload: []byte("rolled back")}); err != nil {
		t.Fatal(err)
	}
	// Not visible while the transaction is open, gone after rollback.
	if n := cycle(t, relay); n != 0 {
		t.Fatalf("uncommitted message published: %d", n)
	}
	_ = tx.Rollback(ctx)
	if n := cycle(t, relay); n != 0 {
		t.Fatalf("rolled back message published: %d", n)
	}

	ids := b.enqueue(t,
		outbox.Message{Topic: "orders", Key: "o1", Headers: map[string][]string{"A": {"1", "2"}}, Payload: []byte("one")},
		outbox.Message{Topic: "orders", Payload: []byte("two")},
		outbox.Message{ID: "fixed-id", Topic: "orders", Payload: []byte("three")})
	if ids[2] != "fixed-id" || len(ids[0]) != 36 || ids[0] == ids[1] {
		t.Fatalf("ids = %q", ids)
	}
	// The same explicit ID again writes nothing.
	b.enqueue(t, outbox.Message{ID: "fixed-id", Topic: "orders", Payload: []byte("three again")})

	if n := cycle(t, relay); n != 3 {
		t.Fatalf("first cycle published %d, want 3", n)
	}
	if n := cycle(t, relay); n != 0 {
		t.Fatalf("second cycle published %d again", n)
	}
	got, sends, _ := rec.snapshot()
	for _, id := range ids {
		if sends[id] != 1 {
			t.Fatalf("message %s published %d times", id, sends[id])
		}
	}
	var first *outbox.StoredMessage
	for _, m := range got {
		if m.ID == ids[0] {
			first = m
		}
	}
	if m := first; m == nil || string(m.Payload) != "one" || m.Key != "o1" || m.Attempt != 1 ||
		strings.Join(m.Headers["A"], ",") != "1,2" || m.CreatedAt.IsZero() {
		t.Fatalf("first message = %+v", m)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE published_at IS NOT NULL"); n != 3 {
		t.Fatalf("rows marked published = %d", n)
	}
}

func TestOutboxEnqueueRefusesBadMessages(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	for name, m := range map[string]outbox.Message{
		"no topic":     {Payload: []byte("x")},
		"long key":     {Topic: "t", Key: strings.Repeat("k", 256)},
		"control char": {Topic: "t\n"},
		"bad utf8 id":  {ID: "\xff", Topic: "t"},
	} {
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.outbox.Enqueue(ctx, tx, m)
		_ = tx.Rollback(ctx)
		var me *outbox.MessageError
		if !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) {
			t.Fatalf("%s: err = %v", name, err)
		}
	}
	if _, err := outbox.NewRelay(b.outbox, nil, outbox.RelayConfig{}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("nil publisher: %v", err)
	}
	if _, err := outbox.NewRelay(b.outbox, newRecorder(), outbox.RelayConfig{MinBackoff: time.Minute, MaxBackoff: time.Second}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("bad backoff: %v", err)
	}
}

// TestOutboxEnqueueKeepsCommitOrderPerKey makes transactions enqueue first
// and take their place in the commit order afterwards (a counter row), so
// that without Enqueue's per-key lock ids and commit order would disagree.
func TestOutboxEnqueueKeepsCommitOrderPerKey(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	b.db.Exec(t, `CREATE TABLE seq (key text PRIMARY KEY, n int NOT NULL)`)
	const keys, perKey = 3, 12
	for k := range keys {
		b.db.Exec(t, `INSERT INTO seq VALUES ($1, 0)`, fmt.Sprint("k", k))
	}
	errs := make([]error, keys*perKey)
	together(keys*perKey, func(i int) {
		key := fmt.Sprint("k", i%keys)
		errs[i] = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			id, err := b.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: key})
			if err != nil {
				return err
			}
			var n int
			if err := tx.QueryRow(ctx, `UPDATE seq SET n = n + 1 WHERE key = $1 RETURNING n`, key).Scan(&n); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE dedupe_outbox SET payload = $2 WHERE message_id = $1`, id, []byte(fmt.Sprint(n)))
			return err
		})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	type row struct {
		Key string
		N   int
	}
	rows, _ := b.db.Pool.Query(ctx, `SELECT key, convert_from(payload, 'UTF8')::int FROM dedupe_outbox ORDER BY id`)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	for _, r := range got {
		if r.N != last[r.Key]+1 {
			t.Fatalf("key %s: id order has commit position %d after %d", r.Key, r.N, last[r.Key])
		}
		last[r.Key] = r.N
	}
	if len(got) != keys*perKey || len(last) != keys {
		t.Fatalf("rows %d, keys %d", len(got), len(last))
	}
}
