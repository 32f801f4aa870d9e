package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/outbox"
)

// enqueueRecorder counts enqueues and adds a trace context to each.
type enqueueRecorder struct {
	outbox.NopObserver
	enqueued atomic.Int32
}

func (r *enqueueRecorder) Enqueued(_ context.Context, m *outbox.Message) {
	r.enqueued.Add(1)
	m.Headers["traceparent"] = []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
}

// TestObserverSeesEnqueues: an Observer's headers (the trace context) are
// stored with an outbox message, beside the message's own.
func TestObserverSeesEnqueues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rec := &enqueueRecorder{}
	ob, err := outbox.New(b.db.Pool, outbox.Config{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	var id string
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		id, err = ob.Enqueue(ctx, tx, outbox.Message{Topic: "t", Headers: map[string][]string{"a": {"b"}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var headers map[string][]string
	if err := b.db.Pool.QueryRow(ctx, `SELECT headers FROM dedupe_outbox WHERE message_id = $1`, id).Scan(&headers); err != nil {
		t.Fatal(err)
	}
	if headers["traceparent"] == nil || headers["a"][0] != "b" {
		t.Fatalf("stored headers = %v", headers)
	}
	if n := rec.enqueued.Load(); n != 1 {
		t.Fatalf("enqueued %d", n)
	}
}
