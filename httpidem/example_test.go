package httpidem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The middleware wraps any router's handlers, after authentication. The
// handler writes through httpidem.Tx so that its rows and the stored
// response commit together.
func ExampleMiddleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	idem, err := httpidem.New(pool, httpidem.Config{
		KeyRequired: true,
		// The tenant set by the authentication middleware, which runs first.
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant-ID"), nil },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := idem.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	go func() { _ = idem.RunPurger(ctx, time.Hour) }()

	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := httpidem.Tx(r.Context())
		if err != nil {
			httpidem.WriteError(w, r, err)
			return
		}
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO payments (amount) VALUES (100) RETURNING id`).Scan(&id); err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError) // rolled back, stored, replayed
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
	_ = http.ListenAndServe("127.0.0.1:3000", mux)
}

// A route may require the key while others keep it optional.
func ExampleMiddleware_Required() {
	var idem *httpidem.Middleware // from httpidem.New
	mux := http.NewServeMux()
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	if idem != nil {
		mux.Handle("POST /orders", idem.Required().Handler(create))   // 400 without a key
		mux.Handle("POST /comments", idem.Optional().Handler(create)) // no key: not deduplicated
	}
}

// A handler whose effect is a call to another API runs in leased mode: the
// claim commits first, so a duplicate answers 409 at once while the call is
// in flight, and a process that dies mid-call frees the key when its lease
// ends. The key derived for the call stays the same on every retry.
func ExampleMiddleware_Leased() {
	var idem *httpidem.Middleware // from httpidem.New
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := httpidem.ClaimFromContext(r.Context()).DerivedKey("charge")
		_ = key // the Idempotency-Key of the call to the payment provider
		w.WriteHeader(http.StatusCreated)
	})
	if idem != nil {
		http.NewServeMux().Handle("POST /payments", idem.Leased().Handler(charge))
	}
}

// PostJSON sends one logical operation; the Transport retries it with the
// same Idempotency-Key, here after the server answered 503 once.
func ExamplePostJSON() {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		first := len(keys) == 1
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"ord_1"}`)
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()

	client, err := httpidem.NewClient(httpidem.TransportConfig{Base: base, MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	var out struct{ ID string }
	reply, err := httpidem.PostJSON(context.Background(), client, srv.URL+"/orders",
		map[string]any{"cart_id": "c1", "total_cents": 1900}, &out, httpidem.WithHeader("Authorization", "Bearer t0k3n"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(reply.Status, out.ID)
	fmt.Println("attempts:", len(keys), "same key:", keys[0] == keys[1] && keys[0] == reply.Key)
	// Output:
	// 201 ord_1
	// attempts: 2 same key: true
}

// Versioned.Update applies a PUT only if its If-Match names the current
// version: 428 without If-Match, 412 when stale.
func ExampleVersioned_Update() {
	var pool *pgxpool.Pool // from pgxpool.New
	orders, err := httpidem.NewVersioned(httpidem.VersionedConfig{Table: "orders", KeyColumns: []string{"tenant_id", "id"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next, err := orders.Update(r.Context(), pool, r, []any{r.Header.Get("X-Tenant-ID"), r.PathValue("id")},
			"total_cents = $1", 2100)
		if err != nil {
			httpidem.WriteError(w, r, err) // 428, 412 or 404 by httpidem.StatusCode
			return
		}
		httpidem.SetETag(w, next)
		w.WriteHeader(http.StatusNoContent)
	})
}
