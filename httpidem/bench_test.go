package httpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
)

// BenchmarkCreateOrder compares POST /orders through the middleware with a
// hand-written handler that does the same insert with its own
// INSERT … ON CONFLICT (tenant_id, idem_key) idempotency check, in the same
// run, and reports the middleware's cost as a ratio ("x_handwritten").
//
//	go test -run '^$' -bench CreateOrder -benchtime 2000x ./httpidem/
func BenchmarkCreateOrder(b *testing.B) {
	bb := setup(b)
	bb.db.Exec(b, `CREATE TABLE orders_hand (id bigserial PRIMARY KEY, tenant_id text NOT NULL, idem_key text NOT NULL,
		cart_id text NOT NULL, total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
		UNIQUE (tenant_id, idem_key))`)
	pool := bb.db.Pool
	hand := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in order
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		tenant, key := r.Header.Get("X-Tenant-ID"), r.Header.Get("Idempotency-Key")
		var out created
		err := pool.QueryRow(r.Context(), `INSERT INTO orders_hand (tenant_id, idem_key, cart_id, total_cents)
			VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, idem_key) DO NOTHING RETURNING id`,
			tenant, key, in.CartID, in.TotalCents).Scan(&out.ID)
		if errors.Is(err, pgx.ErrNoRows) {
			err = pool.QueryRow(r.Context(), `SELECT id FROM orders_hand WHERE tenant_id = $1 AND idem_key = $2`, tenant, key).Scan(&out.ID)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(out)
	})
	payload, _ := json.Marshal(cart)
	var seq atomic.Int64
	run := func(b *testing.B, h http.Handler, fixedKey string) float64 {
		b.ReportAllocs()
		b.SetParallelism(2)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				key := fixedKey
				if key == "" {
					key = "bench-" + strconv.FormatInt(seq.Add(1), 10)
				}
				r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/orders", bytes.NewReader(payload))
				r.Header.Set("X-Tenant-ID", "acme")
				r.Header.Set("Idempotency-Key", key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated {
					b.Errorf("status %d: %s", w.Code, w.Body)
					return
				}
			}
		})
		return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	}
	var handNs float64
	b.Run("handwritten", func(b *testing.B) { handNs = run(b, hand, "") })
	b.Run("middleware", func(b *testing.B) {
		ns := run(b, bb.handler, "")
		if handNs > 0 {
			b.ReportMetric(ns/handNs, "x_handwritten")
		}
	})
	// A duplicate is replayed from the stored response.
	if r := bb.post(b, "acme", "bench-dup", cart); r.status != http.StatusCreated {
		b.Fatalf("seed duplicate: %d", r.status)
	}
	b.Run("middleware-replay", func(b *testing.B) {
		ns := run(b, bb.handler, "bench-dup")
		if handNs > 0 {
			b.ReportMetric(ns/handNs, "x_handwritten")
		}
	})
}
