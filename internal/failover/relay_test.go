package failover

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// recorder is a Publisher that records what the relay published, in order,
// and holds the relay at one chosen publish until the test has killed the
// primary: that publish is confirmed by the broker, and its relay cannot
// record it.
type recorder struct {
	mu      sync.Mutex
	sent    []sent
	holdAt  int
	reached chan struct{}
	resume  chan struct{}
}

type sent struct {
	key string
	seq int
}

func (r *recorder) publish(ctx context.Context, m *outbox.StoredMessage) error {
	seq, err := strconv.Atoi(string(m.Payload))
	if err != nil {
		return dedupe.Permanent(err)
	}
	r.mu.Lock()
	r.sent = append(r.sent, sent{m.Key, seq})
	n := len(r.sent)
	r.mu.Unlock()
	if n == r.holdAt {
		close(r.reached)
		select {
		case <-r.resume:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *recorder) snapshot() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sent(nil), r.sent...)
}

// TestFailoverRelayKeepsKeyOrder: the outbox relay runs on through a
// failover (synchronous replication) and neither loses a row nor publishes a
// key's rows out of order. Rows enqueued before the failover and rows
// enqueued on the new primary (the outbox's id sequence continues there)
// are all published; per key the published sequence never goes back (a
// row whose publish was confirmed as the primary died may go out again:
// at least once, deduplicated downstream by its ID).
func TestFailoverRelayKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := Start(t, Options{Sync: true})
	setupSchema(t, c)
	pool := newPool(t, c.URL(), 6)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const keys, before, after = 8, 15, 10
	enqueue := func(from, to int) {
		for seq := from; seq < to; seq++ {
			for k := range keys {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := ob.Enqueue(ctx, tx, outbox.Message{ID: fmt.Sprintf("k%d-%d", k, seq), Topic: "orders",
					Key: fmt.Sprintf("k%d", k), Payload: []byte(strconv.Itoa(seq))}); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	enqueue(0, before)

	rec := &recorder{holdAt: keys * before / 3, reached: make(chan struct{}), resume: make(chan struct{})}
	relay, err := outbox.NewRelay(ob, outbox.PublishFunc(rec.publish), outbox.RelayConfig{BatchSize: 4,
		PollInterval: 50 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		MaxAttempts: -1})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- relay.Run(rctx) }()
	defer func() {
		stopRelay()
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("relay: %v", err)
		}
	}()

	select {
	case <-rec.reached:
	case <-ctx.Done():
		t.Fatalf("the relay did not reach publish %d", rec.holdAt)
	}
	c.Kill()
	close(rec.resume)
	c.Promote()
	c.Rebuild()
	enqueue(before, before+after)

	want := keys * (before + after)
	var got []sent
	last, at := -1, time.Now()
	for {
		got = rec.snapshot()
		distinct := map[sent]bool{}
		for _, s := range got {
			distinct[s] = true
		}
		if len(distinct) == want {
			break
		}
		if len(distinct) != last {
			last, at = len(distinct), time.Now()
		} else if time.Since(at) > 90*time.Second {
			t.Fatalf("no progress for 90s: %d of %d rows published\n%s", len(distinct), want, c.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	resent := 0
	high := map[string]int{}
	for _, s := range got {
		h, seen := high[s.key]
		switch {
		case !seen && s.seq != 0:
			t.Fatalf("key %s: first published row is %d, want 0 (%v)", s.key, s.seq, got)
		case seen && s.seq == h:
			resent++
		case seen && s.seq != h+1:
			t.Fatalf("key %s: row %d published after row %d: out of order (%v)", s.key, s.seq, h, got)
		}
		high[s.key] = s.seq
	}
	t.Logf("relay across a failover: %d rows of %d keys published in key order, %d sent again", want, keys, resent)
}
