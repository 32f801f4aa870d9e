package dedupe_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// obsRecorder is an Observer that records what it is told.
type obsRecorder struct {
	dedupe.NopObserver
	mu      sync.Mutex
	started []dedupe.HandleInfo
	done    []dedupe.HandleDone
	renewed int
	lost    int
	purged  []int64
}

type ctxMark struct{}

func (r *obsRecorder) StartHandle(ctx context.Context, h dedupe.HandleInfo) (context.Context, func(dedupe.HandleDone)) {
	r.mu.Lock()
	r.started = append(r.started, h)
	r.mu.Unlock()
	return context.WithValue(ctx, ctxMark{}, h.Key.ID), func(d dedupe.HandleDone) {
		r.mu.Lock()
		r.done = append(r.done, d)
		r.mu.Unlock()
	}
}

func (r *obsRecorder) LeaseRenewed(context.Context, dedupe.Key, error) {
	r.mu.Lock()
	r.renewed++
	r.mu.Unlock()
}

func (r *obsRecorder) Purged(_ context.Context, n int64, _ error) {
	r.mu.Lock()
	r.purged = append(r.purged, n)
	r.mu.Unlock()
}

func (r *obsRecorder) outcomes() []dedupe.Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []dedupe.Outcome
	for _, d := range r.done {
		out = append(out, d.Outcome)
	}
	return out
}

// TestObserverSeesEveryHandling: the Observer is told when each handling
// starts (with the transport's MessageInfo, its context reaching the
// handler) and what it came to, in transactional, batch and leased mode.
func TestObserverSeesEveryHandling(t *testing.T) {
	t.Parallel()
	rec := &obsRecorder{}
	b := setup(t, dedupe.Config{Observer: rec})
	ctx := context.Background()
	var sawMark bool
	c := newConsumer(t, b, dedupe.ConsumerConfig[order]{
		Describe: func(o order) dedupe.MessageInfo {
			return dedupe.MessageInfo{System: "test", Destination: "orders", ID: "msg-" + o.ID}
		},
	}, func(ctx context.Context, tx pgx.Tx, o order) error {
		sawMark = ctx.Value(ctxMark{}) == o.ID
		if o.ID == "bad" {
			return errors.New("bad")
		}
		return insertEffect(ctx, tx, o)
	})
	for _, id := range []string{"o1", "o1", "bad"} {
		_, _ = c.Handle(ctx, order{ID: id})
	}
	want := []dedupe.Outcome{dedupe.OutcomeClaimed, dedupe.OutcomeDuplicate, dedupe.OutcomeRetry}
	if got := rec.outcomes(); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("outcomes = %v, want %v", got, want)
	}
	if !sawMark {
		t.Fatal("the handler did not run in the Observer's context")
	}
	rec.mu.Lock()
	if h := rec.started[0]; h.Mode != "transactional" || h.Message.ID != "msg-o1" || h.Key.ID != "o1" {
		t.Fatalf("start = %+v", h)
	}
	if d := rec.done[2]; d.Attempt != 1 || d.Err == nil || d.Duration <= 0 {
		t.Fatalf("failed done = %+v", d)
	}
	rec.mu.Unlock()

	bc := newBatchConsumer(t, b, dedupe.ConsumerConfig[order]{}, nil)
	bc.HandleBatch(ctx, []order{{ID: "b1"}, {ID: "o1"}})
	lc, err := b.inbox.Begin(ctx, dedupe.Key{Scope: "jobs", ID: "l1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.inbox.Complete(ctx, lc, dedupe.Result{}); err != nil {
		t.Fatal(err)
	}
	got := rec.outcomes()
	want = append(want, dedupe.OutcomeClaimed, dedupe.OutcomeDuplicate, dedupe.OutcomeClaimed)
	if len(got) != len(want) {
		t.Fatalf("outcomes = %v, want %v", got, want)
	}
	for n := range want {
		if got[n] != want[n] {
			t.Fatalf("outcomes = %v, want %v", got, want)
		}
	}
	rec.mu.Lock()
	modes := []string{rec.started[3].Mode, rec.started[5].Mode}
	rec.mu.Unlock()
	if modes[0] != "batch" || modes[1] != "leased" {
		t.Fatalf("modes = %v", modes)
	}
}

// TestObserverSeesPurges: purges are reported.
func TestObserverSeesPurges(t *testing.T) {
	t.Parallel()
	rec := &obsRecorder{}
	b := setup(t, dedupe.Config{Observer: rec})
	if _, err := b.inbox.Purge(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.purged) != 1 {
		t.Fatalf("purged %v", rec.purged)
	}
}

// TestHandlerFindsMessageInfo: with an Observer, the handler finds its
// message's MessageInfo (from Describe) in its context, in transactional
// mode and in batch mode (in the batch and in the transactions of its
// fallback), and runs in the context the Observer returned for its own
// message. Without an Observer, Describe is not even called.
func TestHandlerFindsMessageInfo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	describe := func(o order) dedupe.MessageInfo {
		return dedupe.MessageInfo{System: "test", Destination: "orders", ID: "msg-" + o.ID, Partition: -1, Offset: -1}
	}
	var (
		mu  sync.Mutex
		bad []string // what the handler found wrong
		ran int
	)
	handler := func(ctx context.Context, tx pgx.Tx, o order) error {
		mu.Lock()
		ran++
		if m := dedupe.MessageInfoFrom(ctx); m.ID != "msg-"+o.ID {
			bad = append(bad, o.ID+": message id "+m.ID)
		}
		if mark, _ := ctx.Value(ctxMark{}).(string); mark != o.ID {
			bad = append(bad, o.ID+": observer context of "+mark)
		}
		mu.Unlock()
		if o.ID == "fails" {
			return errors.New("fails")
		}
		return insertEffect(ctx, tx, o)
	}
	b := setup(t, dedupe.Config{Observer: &obsRecorder{}})
	cfg := dedupe.ConsumerConfig[order]{Describe: describe}
	if _, err := newConsumer(t, b, cfg, handler).Handle(ctx, order{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	// "fails" fails its attempt; "b1", before it, is handled again.
	res := newBatchConsumer(t, b, cfg, handler).HandleBatch(ctx, []order{{ID: "b1"}, {ID: "fails"}, {ID: "b2"}})
	if res[0].Err != nil || res[1].Outcome != dedupe.OutcomeRetry {
		t.Fatalf("batch results = %+v", res)
	}
	// A batch handler's failure makes the batch fall back to one
	// transaction per message, each with its message's context.
	bcfg := cfg
	bcfg.Scope, bcfg.Key = "batches", orderKey
	bf, err := dedupe.NewBatchConsumerFunc(b.inbox, bcfg, func(ctx context.Context, tx pgx.Tx, os []order) error {
		if len(os) > 1 {
			return errors.New("the whole batch fails")
		}
		return handler(ctx, tx, os[0])
	})
	if err != nil {
		t.Fatal(err)
	}
	if res := bf.HandleBatch(ctx, []order{{ID: "f1"}, {ID: "f2"}}); res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("batch func results = %+v", res)
	}
	mu.Lock()
	if len(bad) > 0 || ran < 6 {
		t.Fatalf("handler ran %d times; found %v", ran, bad)
	}
	mu.Unlock()

	// Without an Observer: no Describe, and nothing in the context.
	quiet := setup(t)
	cfg.Describe = func(order) dedupe.MessageInfo {
		t.Error("Describe called without an Observer")
		return dedupe.MessageInfo{}
	}
	var found dedupe.MessageInfo
	if _, err := newConsumer(t, quiet, cfg, func(ctx context.Context, tx pgx.Tx, o order) error {
		found = dedupe.MessageInfoFrom(ctx)
		return insertEffect(ctx, tx, o)
	}).Handle(ctx, order{ID: "q1"}); err != nil {
		t.Fatal(err)
	}
	if found.System != "" {
		t.Fatalf("MessageInfo without an Observer = %+v, want none", found)
	}
}
