package httpidem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// TestIdemHandlerEndingItsTxWithAStatement: the handler inserts its row,
// ends the request transaction with a statement (ROLLBACK, or COMMIT, then
// perhaps BEGIN), inserts again and answers 201. Neither pgx's guard (a
// transaction begun again looks live) nor database/sql (a *sql.Tx knows
// nothing of it) sees the statement; the middleware's COMMIT must not
// report the work done. In both modes and on both drivers, duplicates fired
// at once afterwards: no client is answered a success (fresh or replayed)
// unless that execution's effects, both rows, committed; the effects of at
// most one execution commit; the first request is never answered 2xx. Over
// pgx the statements after a restart are rolled back with it; over
// database/sql those a ROLLBACK left outside any transaction commit on their
// own, and the key then answers 500 from now on (at most once).
func TestIdemHandlerEndingItsTxWithAStatement(t *testing.T) {
	t.Parallel()
	// The last two end the transaction and write in one simple-protocol
	// statement, which no guard sees between the two: the row commits on its
	// own, and no later execution of the key may commit one of its own.
	inline := `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ('acme', 'call-1-inline', 1)`
	// Those run under RetryServerErrors too: the key must answer 500 from
	// then on whatever the policy for a handler's own 5xx.
	type endCase struct {
		stmt   string
		policy httpidem.ServerErrorPolicy
	}
	cases := []endCase{{"ROLLBACK", 0}, {"ROLLBACK; BEGIN", 0}, {"COMMIT", 0}, {"COMMIT; BEGIN", 0}}
	for _, p := range []httpidem.ServerErrorPolicy{httpidem.StoreServerErrors, httpidem.RetryServerErrors} {
		cases = append(cases, endCase{"ROLLBACK; " + inline, p}, endCase{"ROLLBACK; BEGIN; " + inline + "; COMMIT; BEGIN", p})
	}
	for _, ec := range cases {
		stmt := ec.stmt
		name := strings.ReplaceAll(stmt, inline, "INSERT")
		if ec.policy == httpidem.RetryServerErrors {
			name += "/RetryServerErrors"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forDriversModes(t, func(t *testing.T, drv driver, mode httpidem.Mode) {
				b := setupOn(t, drv, httpidem.Config{Mode: mode, ServerErrors: ec.policy})
				h := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := b.calls.Add(1)
					tx, err := b.requestTx(r.Context())
					insert := func(cart string) {
						if err == nil {
							_, err = tx.Exec(r.Context(), `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ('acme', $1, 1)`, cart)
						}
					}
					insert(fmt.Sprintf("call-%d", n))
					if err == nil && n == 1 {
						_, err = tx.Exec(r.Context(), stmt)
					}
					insert(fmt.Sprintf("call-%d-after", n))
					if err != nil {
						httpidem.WriteError(w, r, err)
						return
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					_, _ = fmt.Fprintf(w, `{"call":%d}`, n)
				}))
				first := toReply(t, serve(h, "key-stmt"))
				if first.status < 300 {
					t.Fatalf("first (ended its transaction with %q) = %d %s, want an error", stmt, first.status, first.body)
				}
				const n = 4
				replies := make([]reply, n)
				together(n, func(i int) { replies[i] = toReply(t, serve(h, "key-stmt")) })
				replies = append(replies, toReply(t, serve(h, "key-stmt")))

				committed := map[string]bool{}
				rows, err := b.db.Pool.Query(context.Background(), `SELECT cart_id FROM orders`)
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var c string
					if err := rows.Scan(&c); err != nil {
						t.Fatal(err)
					}
					committed[c] = true
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				calls := map[string]bool{}
				for c := range committed {
					calls[strings.TrimSuffix(strings.TrimSuffix(c, "-after"), "-inline")] = true
				}
				if len(calls) > 1 {
					t.Fatalf("committed rows %v: the effects of %d executions, want at most one", committed, len(calls))
				}
				for _, r := range replies {
					if r.status >= 300 {
						continue
					}
					call := "call-" + strings.TrimSuffix(strings.TrimPrefix(string(r.body), `{"call":`), "}")
					if !committed[call] || !committed[call+"-after"] {
						t.Fatalf("answered %d %s (replayed=%v) while that execution's rows did not commit (committed: %v)",
							r.status, r.body, r.replayed, committed)
					}
				}
				rec, err := b.mw.Inbox().Lookup(context.Background(), dedupe.Key{Scope: "acme", ID: "key-stmt"})
				if err == nil && rec.Result != nil && rec.Result.Status < 300 && len(calls) == 0 {
					t.Fatalf("stored %d with no effect committed", rec.Result.Status)
				}
			})
		})
	}
}
