package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/dedupetest"
)

// bookEnv is the example's handler, book, on a throwaway schema of
// dedupetest, behind a dedupe.Consumer keyed as the runner keys it (the
// message-id header): the user's view of proving that a handler is
// idempotent, with the faults dedupetest injects.
type bookEnv struct {
	env *dedupetest.Env
	c   *dedupe.Consumer[kafka.Message]
}

func newBookEnv(t *testing.T, inbox func(*dedupetest.Env) *dedupe.Inbox) *bookEnv {
	t.Helper()
	env := dedupetest.New(t, dedupetest.Options{Setup: []string{createLedger}})
	c, err := dedupe.NewConsumer(inbox(env), dedupe.ConsumerConfig[kafka.Message]{
		Scope: "payments",
		Key: func(m kafka.Message) (string, error) {
			for _, h := range m.Headers {
				if h.Key == "message-id" {
					return string(h.Value), nil
				}
			}
			return "", dedupe.ErrNoKey
		},
	}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error { return book(ctx, tx, []kafka.Message{m}) })
	if err != nil {
		t.Fatal(err)
	}
	return &bookEnv{env: env, c: c}
}

func defaultInbox(e *dedupetest.Env) *dedupe.Inbox { return e.Inbox }

func paymentMsg(id string) kafka.Message {
	return kafka.Message{Topic: "payments", Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}},
		Value: []byte(fmt.Sprintf(`{"payment_id":%q,"account":"acme","amount_cents":1250}`, id))}
}

func (b *bookEnv) booked(t *testing.T, id string) int {
	t.Helper()
	return b.env.Count(t, "SELECT count(*) FROM ledger WHERE payment_id = $1", id)
}

// TestBookExactlyOnceUnderConcurrentDuplicates: eight copies of a payment
// at the same instant book it once.
func TestBookExactlyOnceUnderConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := newBookEnv(t, defaultInbox)
	dedupetest.Deliver(t, b.c, paymentMsg("pay-1"), 8).ExactlyOnce(t)
	if n := b.booked(t, "pay-1"); n != 1 {
		t.Fatalf("ledger rows = %d, want 1", n)
	}
}

// TestBookLostCommitReply: the reply to the booking's COMMIT is lost; the
// inbox resolves it, and a redelivery is a duplicate: one ledger row.
func TestBookLostCommitReply(t *testing.T) {
	t.Parallel()
	var faulty *dedupetest.Faulty
	b := newBookEnv(t, func(e *dedupetest.Env) *dedupe.Inbox { faulty = e.Faulty(t); return faulty.Inbox })
	faulty.LoseNextCommitReply()
	d := dedupetest.UntilSettled(t, b.c, paymentMsg("pay-2"), 5)
	if faulty.CommitRepliesLost() != 1 {
		t.Fatalf("commit replies lost = %d, want 1", faulty.CommitRepliesLost())
	}
	if n := b.booked(t, "pay-2"); n != 1 {
		t.Fatalf("ledger rows = %d after %s, want 1", n, d)
	}
	if o, _ := b.c.Handle(context.Background(), paymentMsg("pay-2")); o != dedupe.OutcomeDuplicate {
		t.Fatalf("redelivery = %v, want duplicate", o)
	}
}

// TestBookFailedCommitIsRetriedOnce: the booking's COMMIT fails after the
// handler ran; nothing of it stays, and the redelivery books it once.
func TestBookFailedCommitIsRetriedOnce(t *testing.T) {
	t.Parallel()
	b := newBookEnv(t, defaultInbox)
	b.env.FailNextCommit(t)
	if o, err := b.c.Handle(context.Background(), paymentMsg("pay-3")); err == nil {
		t.Fatalf("first delivery = %v, want the injected commit failure", o)
	}
	if n := b.booked(t, "pay-3"); n != 0 {
		t.Fatalf("ledger rows after the failed commit = %d, want 0", n)
	}
	if o, err := b.c.Handle(context.Background(), paymentMsg("pay-3")); o != dedupe.OutcomeClaimed || err != nil {
		t.Fatalf("redelivery = %v, %v; want claimed", o, err)
	}
	if n := b.booked(t, "pay-3"); n != 1 {
		t.Fatalf("ledger rows = %d, want 1", n)
	}
}

// TestBookPoisonedKeyIsNeverBooked: a key marked failed (poisoned) is
// refused without running the handler.
func TestBookPoisonedKeyIsNeverBooked(t *testing.T) {
	t.Parallel()
	b := newBookEnv(t, defaultInbox)
	b.env.Poison(t, dedupe.Key{Scope: "payments", ID: "pay-4"})
	if o, _ := b.c.Handle(context.Background(), paymentMsg("pay-4")); o != dedupe.OutcomePoisoned {
		t.Fatalf("delivery of a poisoned key = %v, want poisoned", o)
	}
	if n := b.booked(t, "pay-4"); n != 0 {
		t.Fatalf("ledger rows = %d, want 0", n)
	}
}
