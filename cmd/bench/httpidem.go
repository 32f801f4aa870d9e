package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/httpidem"
)

// The tables of the HTTP rows: the orders a request creates, and the
// hand-written handler's own key table (fingerprint, stored response,
// expiry with its purge index), as wide as the work it does.
const (
	sqlCreateOrders = `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, tenant_id text NOT NULL,
    cart_id text NOT NULL, total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`
	sqlCreateHandKeys = `CREATE TABLE IF NOT EXISTS hand_keys (tenant text NOT NULL, key text NOT NULL,
    fingerprint bytea NOT NULL, status int, headers jsonb, body bytea, created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL, PRIMARY KEY (tenant, key))`
	sqlCreateHandKeysExpiry = `CREATE INDEX IF NOT EXISTS hand_keys_expires_at ON hand_keys (expires_at)`
	sqlResetHTTP            = `TRUNCATE orders, hand_keys, dedupe_http_keys`

	sqlOrder       = `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ($1, $2, $3) RETURNING id`
	sqlHandIdClaim = `INSERT INTO hand_keys (tenant, key, fingerprint, created_at, expires_at)
VALUES ($1, $2, $3, now(), now() + interval '24 hours') ON CONFLICT (tenant, key) DO NOTHING RETURNING 1`
	sqlHandIdStored = `SELECT fingerprint, status, headers, body FROM hand_keys WHERE tenant = $1 AND key = $2`
	sqlHandIdStore  = `UPDATE hand_keys SET status = $3, headers = $4, body = $5 WHERE tenant = $1 AND key = $2`
)

// lockTimeout is both handlers' lock timeout. It is longer than httpidem's
// default (100ms) because the rows never send a key twice at once, and on an
// overloaded machine a new key's insert can wait that long for a lock that
// has nothing to do with the key (the table's extension lock), which would
// answer 409 and end the run.
const lockTimeout = 5 * time.Second

// handBegin begins the hand-written handler's transaction with its lock
// timeout, in one round trip.
var handBegin = pgx.TxOptions{BeginQuery: fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = '%dms'", lockTimeout.Milliseconds())}

// tenant is the HTTP rows' tenant.
const tenant = "acme"

// order is the request body of POST /orders.
type order struct {
	CartID     string `json:"cart_id"`
	TotalCents int64  `json:"total_cents"`
}

// created is its response.
type created struct {
	ID int64 `json:"id"`
}

// httpBench is the HTTP rows' state: POST /orders through httpidem's
// middleware (transactional mode), and the same endpoint with its
// idempotency written by hand. Requests are served in-process
// (httptest.NewRecorder), so no network is measured.
type httpBench struct {
	pool      *pgxpool.Pool
	lib, hand http.Handler
	payload   []byte
	seq       atomic.Int64
	replayRun string
	replays   int
}

func newHTTPBench(ctx context.Context, pool *pgxpool.Pool, replays int) (*httpBench, error) {
	mw, err := httpidem.New(pool, httpidem.Config{
		Tenant:      func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant-ID"), nil },
		LockTimeout: lockTimeout,
	})
	if err != nil {
		return nil, err
	}
	if err := mw.Migrate(ctx); err != nil {
		return nil, err
	}
	for _, s := range []string{sqlCreateOrders, sqlCreateHandKeys, sqlCreateHandKeysExpiry} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return nil, err
		}
	}
	payload, err := json.Marshal(order{CartID: "cart-1", TotalCents: 1900})
	if err != nil {
		return nil, err
	}
	return &httpBench{pool: pool, lib: mw.Handler(http.HandlerFunc(createOrder)), hand: handWrittenIdem(pool),
		payload: payload, replays: replays}, nil
}

// clear empties the HTTP rows' tables.
func (h *httpBench) clear(ctx context.Context) error {
	return truncate(ctx, h.pool, sqlResetHTTP)
}

// post sends POST /orders with key to handler and checks the answer: 201,
// replayed or not as want says.
func (h *httpBench) post(ctx context.Context, handler http.Handler, key string, replayed bool) error {
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", bytes.NewReader(h.payload))
	r.Header.Set("X-Tenant-ID", tenant)
	r.Header.Set(httpidem.DefaultHeader, key)
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		return fmt.Errorf("bench: POST /orders: %d %s", w.Code, bytes.TrimSpace(w.Body.Bytes()))
	}
	if got := w.Header().Get(httpidem.ReplayedHeader) == "true"; got != replayed {
		return fmt.Errorf("bench: POST /orders with key %s: replayed %v, want %v", key, got, replayed)
	}
	return nil
}

// opNew sends requests with new keys.
func (h *httpBench) opNew(handler http.Handler) op {
	return func(ctx context.Context, _ int) (int, error) {
		return 1, h.post(ctx, handler, "new-"+strconv.FormatInt(h.seq.Add(1), 10), false)
	}
}

// opReplay sends the keys preloadReplays committed, in turn.
func (h *httpBench) opReplay(handler http.Handler) op {
	return func(ctx context.Context, _ int) (int, error) {
		return 1, h.post(ctx, handler, h.replayKey(h.seq.Add(1)%int64(h.replays)), true)
	}
}

func (h *httpBench) replayKey(n int64) string { return h.replayRun + "-" + strconv.FormatInt(n, 10) }

// preloadReplays empties the tables and creates the replay rows' orders
// through each handler, 8 requests at a time.
func (h *httpBench) preloadReplays(ctx context.Context) error {
	if err := h.clear(ctx); err != nil {
		return err
	}
	h.replayRun = "replay" + strconv.FormatInt(h.seq.Add(1), 10)
	for _, handler := range []http.Handler{h.lib, h.hand} {
		var (
			next     atomic.Int64
			wg       sync.WaitGroup
			errOnce  sync.Once
			firstErr error
		)
		for range 8 {
			wg.Go(func() {
				for n := next.Add(1) - 1; n < int64(h.replays); n = next.Add(1) - 1 {
					if err := h.post(ctx, handler, h.replayKey(n), false); err != nil {
						errOnce.Do(func() { firstErr = err })
						return
					}
				}
			})
		}
		wg.Wait()
		if firstErr != nil {
			return firstErr
		}
	}
	_, err := h.pool.Exec(ctx, "ANALYZE orders, hand_keys, dedupe_http_keys")
	return err
}

// createOrder is POST /orders behind the middleware: it inserts the order
// through the request's transaction.
func createOrder(w http.ResponseWriter, r *http.Request) {
	var in order
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tx, err := httpidem.Tx(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var out created
	if err := tx.QueryRow(r.Context(), sqlOrder, r.Header.Get("X-Tenant-ID"), in.CartID, in.TotalCents).Scan(&out.ID); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(out.ID, 10))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(out)
}

// handWrittenIdem is POST /orders with its idempotency written by hand,
// doing the middleware's work: fingerprint, a claim with a lock timeout
// (409 while a concurrent request holds the key), 422 for another payload,
// the replay of the stored response, and a new order committed together
// with its stored response. It begins its transaction the usual way (BEGIN
// with SET LOCAL lock_timeout), then sends the claim, the end of its lock
// timeout (the handler's own statements must not be cut off by it) and a
// savepoint in one batch: a failing order rolls back to the savepoint and
// its 500 is stored with the key, as httpidem's default (StoreServerErrors)
// does, the same statements for the same guarantees.
func handWrittenIdem(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tenant, key := r.Header.Get("X-Tenant-ID"), r.Header.Get(httpidem.DefaultHeader)
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
		tx, err := pool.BeginTx(ctx, handBegin)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
		var (
			one      int
			inserted bool
		)
		b := &pgx.Batch{}
		b.Queue(sqlHandIdClaim, tenant, key, fp).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&one)
			inserted = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		b.Queue(`SET LOCAL lock_timeout TO DEFAULT`)
		b.Queue(`SAVEPOINT before_order`)
		err = tx.SendBatch(ctx, b).Close()
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
			if err := tx.QueryRow(ctx, sqlHandIdStored, tenant, key).Scan(&storedFp, &status, &headers, &storedBody); err != nil {
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
				w.Header().Set(httpidem.ReplayedHeader, "true")
				w.WriteHeader(*status)
				_, _ = w.Write(storedBody)
			}
			return
		}
		var out created
		if err := tx.QueryRow(ctx, sqlOrder, tenant, in.CartID, in.TotalCents).Scan(&out.ID); err != nil {
			// The order rolls back; its 500 is stored with the key.
			msg := []byte(err.Error())
			_, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT before_order`)
			if rerr == nil {
				_, rerr = tx.Exec(ctx, sqlHandIdStore, tenant, key, http.StatusInternalServerError, []byte(`{}`), msg)
			}
			if rerr == nil {
				rerr = tx.Commit(ctx)
			}
			if rerr != nil {
				http.Error(w, rerr.Error(), http.StatusServiceUnavailable)
				return
			}
			http.Error(w, string(msg), http.StatusInternalServerError)
			return
		}
		resp, _ := json.Marshal(out)
		resp = append(resp, '\n')
		hdr := map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/" + strconv.FormatInt(out.ID, 10)}}
		headers, _ := json.Marshal(hdr)
		if _, err := tx.Exec(ctx, sqlHandIdStore, tenant, key, http.StatusCreated, headers, resp); err != nil {
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
