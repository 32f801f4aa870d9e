package httpidem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkCreateOrder compares POST /orders through the middleware, in
// both modes, with hand-written handlers that do the same work by hand: a
// claim row in their own key table (fingerprint, expiry, purge index), the
// order insert, the stored response and one commit, with a lock timeout so
// that a concurrent duplicate gets 409. "hand" begins its transaction the
// usual way (BEGIN with SET LOCAL lock_timeout, then the claim: five round
// trips for a new key); "hand-pipelined" sends BEGIN, the lock timeout and
// the claim in one round trip, as the transactional mode does (four).
//
// Each round runs every variant for b.N requests from one client, then
// from four concurrent ones, in an order that rotates between rounds; a
// ratio is the variant's throughput over the hand-written handler's in the
// same round (≥ 1 is as fast). Reported: the median time per request of each
// variant and the min and median ratio over the rounds ("/pipelined": over
// hand-pipelined). The "replay" rows send one key over and over and compare
// with the hand-written handler's replay.
//
//	go test -run '^$' -bench CreateOrder -benchtime 300x ./httpidem/
func BenchmarkCreateOrder(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) { benchCreateOrder(b, workers) })
	}
}

func benchCreateOrder(b *testing.B, workers int) {
	const rounds = 7
	bb := setup(b)
	bb.db.Exec(b, `CREATE TABLE hand_keys (tenant text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
		status int, headers jsonb, body bytea, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
		PRIMARY KEY (tenant, key))`)
	bb.db.Exec(b, `CREATE INDEX hand_keys_expires_at ON hand_keys (expires_at)`)
	pool := bb.db.Pool
	type variant struct {
		name, vs string // vs: the baseline of its ratio
		h        http.Handler
		fixedKey string // a replay variant sends this key every time
	}
	variants := []variant{
		{name: "hand", h: handWritten(pool, false)},
		{name: "hand-pipelined", h: handWritten(pool, true)},
		{name: "transactional", vs: "hand", h: bb.handler},
		{name: "leased", vs: "hand", h: bb.mw.Leased().Handler(http.HandlerFunc(bb.createOrder))},
		{name: "hand-replay", h: handWritten(pool, false), fixedKey: "dup-hand"},
		{name: "transactional-replay", vs: "hand-replay", h: bb.handler, fixedKey: "dup-tx"},
		{name: "leased-replay", vs: "hand-replay", h: bb.mw.Leased().Handler(http.HandlerFunc(bb.createOrder)), fixedKey: "dup-leased"},
	}
	payload, _ := json.Marshal(cart)
	send := func(h http.Handler, key string) bool {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/orders", bytes.NewReader(payload))
		r.Header.Set("X-Tenant-ID", "acme")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Errorf("status %d: %s", w.Code, w.Body)
			return false
		}
		return true
	}
	for _, v := range variants {
		if v.fixedKey != "" && !send(v.h, v.fixedKey) {
			b.FailNow()
		}
	}
	var seq atomic.Int64
	run := func(v variant) time.Duration {
		var (
			next atomic.Int64
			wg   sync.WaitGroup
		)
		start := time.Now()
		for range workers {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					key := v.fixedKey
					if key == "" {
						key = "bench-" + strconv.FormatInt(seq.Add(1), 10)
					}
					if !send(v.h, key) {
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start) / time.Duration(b.N)
	}
	perReq := map[string][]float64{}
	ratios := map[string][]float64{}
	b.ResetTimer()
	for round := range rounds {
		took := map[string]time.Duration{}
		for i := range variants {
			v := variants[(i+round)%len(variants)]
			took[v.name] = run(v)
			perReq[v.name] = append(perReq[v.name], float64(took[v.name].Microseconds()))
		}
		for _, v := range variants {
			if v.vs != "" {
				ratios[v.name] = append(ratios[v.name], float64(took[v.vs])/float64(took[v.name]))
				if v.vs == "hand" {
					ratios[v.name+"/pipelined"] = append(ratios[v.name+"/pipelined"], float64(took["hand-pipelined"])/float64(took[v.name]))
				}
			}
		}
	}
	b.StopTimer()
	for _, v := range variants {
		b.ReportMetric(median(perReq[v.name]), "µs/req:"+v.name)
	}
	for name, rs := range ratios {
		b.ReportMetric(slices.Min(rs), "min:"+name)
		b.ReportMetric(median(rs), "median:"+name)
	}
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Hand-written SQL of the baseline: its own key table.
const (
	handClaim = `INSERT INTO hand_keys (tenant, key, fingerprint, created_at, expires_at)
VALUES ($1, $2, $3, now(), now() + interval '24 hours') ON CONFLICT (tenant, key) DO NOTHING RETURNING 1`
	handStored = `SELECT fingerprint, status, headers, body FROM hand_keys WHERE tenant = $1 AND key = $2`
	handOrder  = `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ($1, $2, $3) RETURNING id`
	handStore  = `UPDATE hand_keys SET status = $3, headers = $4, body = $5 WHERE tenant = $1 AND key = $2`
)

// handWritten is POST /orders with its idempotency written by hand, doing
// the middleware's work: fingerprint, claim with a lock timeout (409 when a
// concurrent request holds the key), 422 for another payload, replay of the
// stored response, and a new order committed with its stored response.
func handWritten(pool *pgxpool.Pool, pipelined bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tenant, key := r.Header.Get("X-Tenant-ID"), r.Header.Get("Idempotency-Key")
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h := sha256.New()
		h.Write([]byte(r.Method + " " + r.URL.Path + "\n"))
		h.Write(body)
		fp := h.Sum(nil)
		var in order
		if err := json.Unmarshal(body, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var (
			tx       pgx.Tx
			inserted bool
			one      int
		)
		if pipelined {
			batch := &pgx.Batch{}
			batch.BeginTx(pgx.TxOptions{})
			batch.Queue(`SELECT set_config('lock_timeout', '100ms', true)`)
			batch.Queue(handClaim, tenant, key, fp).QueryRow(func(row pgx.Row) error {
				err := row.Scan(&one)
				inserted = err == nil
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				return err
			})
			br := pool.SendBatch(ctx, batch)
			tx = br.Tx()
			err = br.Close()
		} else {
			tx, err = pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL lock_timeout = '100ms'"})
			if err == nil {
				err = tx.QueryRow(ctx, handClaim, tenant, key, fp).Scan(&one)
				inserted = err == nil
				if errors.Is(err, pgx.ErrNoRows) {
					err = nil
				}
			}
		}
		if tx != nil {
			defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "55P03":
			http.Error(w, "in flight", http.StatusConflict)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		case !inserted:
			var (
				storedFp, storedBody, headers []byte
				status                        *int
			)
			if err := tx.QueryRow(ctx, handStored, tenant, key).Scan(&storedFp, &status, &headers, &storedBody); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			switch {
			case !bytes.Equal(storedFp, fp):
				http.Error(w, "key reused", http.StatusUnprocessableEntity)
			case status == nil:
				http.Error(w, "in flight", http.StatusConflict)
			default:
				var hdr map[string][]string
				_ = json.Unmarshal(headers, &hdr)
				for k, v := range hdr {
					w.Header()[k] = v
				}
				w.Header().Set("Idempotent-Replayed", "true")
				w.WriteHeader(*status)
				_, _ = w.Write(storedBody)
			}
			return
		}
		var out created
		if err := tx.QueryRow(ctx, handOrder, tenant, in.CartID, in.TotalCents).Scan(&out.ID); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp, _ := json.Marshal(out)
		resp = append(resp, '\n')
		hdr := map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/" + strconv.FormatInt(out.ID, 10)}}
		headers, _ := json.Marshal(hdr)
		if _, err := tx.Exec(ctx, handStore, tenant, key, http.StatusCreated, headers, resp); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(resp)
	})
}
