package httpidem_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// TestIdemSQLHandlerEndingItsTxIsSettledAsEnded: over database/sql the
// handler's *sql.Tx cannot be guarded, so a handler may call its Commit or
// Rollback. The middleware finds out on its next statement (sql.ErrTxDone)
// and settles the request as one whose transaction was ended behind its
// back, as over pgx: in both modes the key answers 500 from now on, so that
// nothing the handler wrote outside the transaction runs twice (in
// transactional mode a fresh connection tells whether the claim committed
// with the handler's effects; if it went with a rollback, the 500 is
// claimed and stored anew). Before, a rollback released the key and a retry
// executed.
func TestIdemSQLHandlerEndingItsTxIsSettledAsEnded(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"COMMIT", "ROLLBACK"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			forModes(t, func(t *testing.T, mode httpidem.Mode) {
				b := setupOn(t, sqlDriver, httpidem.Config{Mode: mode})
				in := cart
				in.EndTx = end
				first := b.post(t, "acme", "key-end", in)
				if first.status != http.StatusInternalServerError || first.replayed {
					t.Fatalf("first = %d replayed=%v %s, want a fresh 500", first.status, first.replayed, first.body)
				}
				if p := b.endErr.Load(); p == nil || !errors.Is(*p, sql.ErrTxDone) {
					t.Fatalf("the INSERT after the handler's %s returned %v, want sql.ErrTxDone", end, p)
				}
				wantOrders := 0
				if end == "COMMIT" {
					wantOrders = 1 // the handler's own commit took its first insert
				}
				if got := b.orders(t, "acme"); got != wantOrders {
					t.Fatalf("orders = %d, want %d", got, wantOrders)
				}
				const n = 4
				replies := make([]reply, n)
				together(n, func(i int) { replies[i] = b.post(t, "acme", "key-end", in) })
				// The key holds the 500: replayed, the handler runs once.
				if fresh, _, _ := countReplies(t, replies, http.StatusInternalServerError); fresh != 0 ||
					b.calls.Load() != 1 || b.orders(t, "acme") != wantOrders {
					t.Fatalf("retries: %d fresh 500s, %d calls, %d orders; want the stored 500 replayed", fresh, b.calls.Load(),
						b.orders(t, "acme"))
				}
				rec, err := b.mw.Inbox().Lookup(context.Background(), dedupe.Key{Scope: "acme", ID: "key-end"})
				if err != nil || rec.Result == nil || rec.Result.Status != http.StatusInternalServerError {
					t.Fatalf("stored key = %+v, %v; want its 500", rec, err)
				}
			})
		})
	}
}

// TestIdemTxAccessorOfTheOtherDriverIsRefused: Tx over a database/sql
// middleware and SQLTx over a pgx one return ErrWrongDriver, in both modes,
// and the request is answered as the handler answers that error, with
// nothing begun.
func TestIdemTxAccessorOfTheOtherDriverIsRefused(t *testing.T) {
	t.Parallel()
	forDriversModes(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
		b := setupOn(t, drv, httpidem.Config{Mode: mode, ServerErrors: httpidem.RetryServerErrors})
		var got error
		b.handler = b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if drv == sqlDriver {
				_, got = httpidem.Tx(r.Context())
			} else {
				_, got = httpidem.SQLTx(r.Context())
			}
			httpidem.WriteError(w, r, got)
		}))
		r := b.post(t, "acme", "key-wrong", cart)
		if !errors.Is(got, httpidem.ErrWrongDriver) || httpidem.StatusCode(got) != http.StatusInternalServerError {
			t.Fatalf("the other driver's accessor returned %v, want ErrWrongDriver (500)", got)
		}
		if r.status != http.StatusInternalServerError {
			t.Fatalf("answer = %d %s, want 500", r.status, r.body)
		}
	})
	// Outside a request both say ErrNoTx.
	if _, err := httpidem.SQLTx(context.Background()); !errors.Is(err, httpidem.ErrNoTx) {
		t.Fatalf("SQLTx outside a request = %v, want ErrNoTx", err)
	}
}

// TestIdemNewRefusesOtherDBs: New takes a pgx pool or dedupe.SQL's handle,
// nothing else.
func TestIdemNewRefusesOtherDBs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := httpidem.New(dedupe.SQLTx(nil), httpidem.Config{}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("New(a transaction) = %v, want ErrInvalidConfig", err)
	}
	if _, err := httpidem.New(sqlDriver.open(t, b.db.URL, 2), httpidem.Config{}); err != nil {
		t.Fatalf("New(dedupe.SQL(db)) = %v", err)
	}
}
