package httpidem_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// TestIdemHandlerCannotCommitOrRollBack: the transaction a handler gets from
// Tx belongs to the middleware in both modes. Commit and Rollback are
// refused (ErrTxManaged, which matches dedupe.ErrTxOwned), and after a
// ROLLBACK sent as a statement the handler's next INSERT is refused
// (ErrTxEnded) instead of committing on its own outside the request's
// transaction. Before, the INSERT autocommitted: the order existed though
// the request's transaction had been rolled back.
func TestIdemHandlerCannotCommitOrRollBack(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode httpidem.Mode) {
		b := setup(t, httpidem.Config{Mode: mode})
		if r := b.post(t, "acme", "key-owned", cart); r.status != http.StatusCreated {
			t.Fatalf("first = %d %s", r.status, r.body)
		}
		errs := b.txErrs.Load()
		for i, err := range errs {
			if !errors.Is(err, httpidem.ErrTxManaged) || !errors.Is(err, dedupe.ErrTxOwned) {
				t.Errorf("%s returned %v, want ErrTxManaged and dedupe.ErrTxOwned", [2]string{"Commit", "Rollback"}[i], err)
			}
		}

		end := cart
		end.EndTx = "ROLLBACK"
		first := b.post(t, "acme", "key-rollback", end)
		if first.status != http.StatusInternalServerError {
			t.Fatalf("answer after a ROLLBACK statement = %d %s, want 500", first.status, first.body)
		}
		p := b.endErr.Load()
		if p == nil || !errors.Is(*p, httpidem.ErrTxEnded) || !errors.Is(*p, dedupe.ErrTxEnded) {
			t.Fatalf("the INSERT after a ROLLBACK statement returned %v, want ErrTxEnded", p)
		}
		if got := b.orders(t, "acme"); got != 1 {
			t.Fatalf("orders = %d, want 1 (the first request's): the INSERT after the ROLLBACK must not commit", got)
		}
		// Retries at once: in both modes the 500 is stored and replayed.
		// The middleware cannot tell what the statement that ended the
		// transaction wrote after the end ("ROLLBACK; INSERT ..." as one
		// query commits the INSERT on its own), so the handler never runs
		// again; before, in transactional mode, one retry executed.
		const n = 4
		replies := make([]reply, n)
		together(n, func(i int) { replies[i] = b.post(t, "acme", "key-rollback", end) })
		if fresh, _, _ := countReplies(t, replies, http.StatusInternalServerError); fresh != 0 || b.orders(t, "acme") != 1 {
			t.Fatalf("retries: %d fresh 500s, %d orders; want the stored 500 replayed", fresh, b.orders(t, "acme"))
		}
	})
}

// TestIdemHandlerCommitStatementTiesTheKeyTo500: in transactional mode a
// handler that sends COMMIT as a statement commits the claim with its
// effects, behind the middleware's back. The middleware learns it on a
// fresh connection and stores its 500 with the key, so a retry is answered
// 500 too instead of a replay of nothing (or a second execution).
func TestIdemHandlerCommitStatementTiesTheKeyTo500(t *testing.T) {
	t.Parallel()
	b := setup(t)
	end := cart
	end.EndTx = "COMMIT"
	first := b.post(t, "acme", "key-commit", end)
	if first.status != http.StatusInternalServerError {
		t.Fatalf("first = %d %s, want 500", first.status, first.body)
	}
	if p := b.endErr.Load(); p == nil || !errors.Is(*p, httpidem.ErrTxEnded) {
		t.Fatalf("the INSERT after a COMMIT statement returned %v, want ErrTxEnded", p)
	}
	again := b.post(t, "acme", "key-commit", end)
	if again.status != http.StatusInternalServerError || !again.replayed || b.calls.Load() != 1 {
		t.Fatalf("retry = %d replayed=%v (handler calls %d), want the stored 500", again.status, again.replayed, b.calls.Load())
	}
	rec, err := b.mw.Inbox().Lookup(context.Background(), dedupe.Key{Scope: "acme", ID: "key-commit"})
	if err != nil || rec.Result == nil || rec.Result.Status != http.StatusInternalServerError {
		t.Fatalf("stored key = %+v, %v; want its 500", rec, err)
	}
	if got := b.orders(t, "acme"); got != 1 {
		t.Fatalf("orders = %d, want 1 (committed by the handler's COMMIT)", got)
	}
}
