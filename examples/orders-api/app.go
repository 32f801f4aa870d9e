package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// order is the API's resource.
type order struct {
	ID         string    `json:"id"`
	TenantID   string    `json:"tenant_id"`
	CartID     string    `json:"cart_id"`
	TotalCents int64     `json:"total_cents"`
	CreatedAt  time.Time `json:"created_at"`
	Version    int64     `json:"version"`
}

// orderInput is the body of POST and PUT.
type orderInput struct {
	CartID     string `json:"cart_id"`
	TotalCents *int64 `json:"total_cents"`
}

func (in orderInput) validate() error {
	switch {
	case in.CartID == "":
		return errors.New("cart_id is required")
	case in.TotalCents == nil:
		return errors.New("total_cents is required")
	case *in.TotalCents < 0:
		return errors.New("total_cents must not be negative")
	}
	return nil
}

// app holds the API's dependencies.
type app struct {
	pool     *pgxpool.Pool
	idem     *httpidem.Middleware
	versions *httpidem.Versioned
	log      *slog.Logger
}

// newApp creates the tables and the idempotency layer, which reports to obs
// (nil for none).
func newApp(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger, obs dedupe.Observer) (*app, error) {
	idem, err := httpidem.New(pool, httpidem.Config{
		Inbox:       dedupe.Config{Observer: obs},
		KeyRequired: true,
		Tenant:      func(r *http.Request) (string, error) { return tenantFrom(r.Context()), nil },
		Logger:      log,
	})
	if err != nil {
		return nil, err
	}
	if err := idem.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("migrate idempotency keys: %w", err)
	}
	for _, stmt := range []string{sqlCreateOrders, sqlCreateOrdersIndex} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("create orders: %w", err)
		}
	}
	versions, err := httpidem.NewVersioned(httpidem.VersionedConfig{Table: "orders", KeyColumns: []string{"tenant_id", "id"}})
	if err != nil {
		return nil, err
	}
	return &app{pool: pool, idem: idem, versions: versions, log: log}, nil
}

// routes wires the API: authentication first, then the idempotency layer
// (POST only), then the handlers.
func (a *app) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", a.idem.Handler(http.HandlerFunc(a.createOrder)))
	mux.HandleFunc("GET /orders/{id}", a.getOrder)
	mux.HandleFunc("PUT /orders/{id}", a.putOrder)
	return authenticate(mux)
}

type tenantKey struct{}

// authenticate stands in for real authentication: the tenant is the
// X-Tenant-ID header; without it the request is refused with 401 before the
// idempotency layer sees it, so the refusal is never tied to a key.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.Header.Get("X-Tenant-ID")
		if tenant == "" || len(tenant) > 255 {
			httpidem.WriteError(w, r, &httpidem.Error{Status: http.StatusUnauthorized, Err: httpidem.ErrNoTenant, Detail: "X-Tenant-ID header is required"})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

func tenantFrom(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// createOrder inserts the order in the request transaction: in the
// middleware's default, transactional mode it already holds the key's claim,
// and the claim, the order and the stored 201 commit together. A concurrent
// retry with the same key waits at most the lock timeout (100 ms) and gets
// 409, or the replay once this one committed.
func (a *app) createOrder(w http.ResponseWriter, r *http.Request) {
	in, ok := decode(w, r)
	if !ok {
		return
	}
	tx, err := httpidem.Tx(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	o, err := scanOrder(tx.QueryRow(r.Context(), sqlInsertOrder, tenantFrom(r.Context()), in.CartID, *in.TotalCents))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Location", "/orders/"+o.ID)
	httpidem.SetETag(w, o.Version)
	writeJSON(w, http.StatusCreated, o)
}

func (a *app) getOrder(w http.ResponseWriter, r *http.Request) {
	o, ok := a.load(w, r)
	if !ok || httpidem.NotModified(w, r, o.Version) {
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// putOrder replaces the order if If-Match names its current version.
func (a *app) putOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !uuidPattern.MatchString(id) {
		httpidem.WriteError(w, r, &httpidem.Error{Status: http.StatusNotFound, Err: httpidem.ErrNotFound})
		return
	}
	in, ok := decode(w, r)
	if !ok {
		return
	}
	if _, err := a.versions.Update(r.Context(), a.pool, r, []any{tenantFrom(r.Context()), id}, setOrder, in.CartID, *in.TotalCents); err != nil {
		a.fail(w, r, err)
		return
	}
	o, ok := a.load(w, r)
	if !ok {
		return
	}
	httpidem.SetETag(w, o.Version)
	writeJSON(w, http.StatusOK, o)
}

func (a *app) load(w http.ResponseWriter, r *http.Request) (order, bool) {
	id := r.PathValue("id")
	if !uuidPattern.MatchString(id) {
		httpidem.WriteError(w, r, &httpidem.Error{Status: http.StatusNotFound, Err: httpidem.ErrNotFound})
		return order{}, false
	}
	o, err := scanOrder(a.pool.QueryRow(r.Context(), sqlGetOrder, tenantFrom(r.Context()), id))
	if errors.Is(err, pgx.ErrNoRows) {
		httpidem.WriteError(w, r, &httpidem.Error{Status: http.StatusNotFound, Err: httpidem.ErrNotFound})
		return order{}, false
	}
	if err != nil {
		a.fail(w, r, err)
		return order{}, false
	}
	return o, true
}

func scanOrder(row pgx.Row) (order, error) {
	var o order
	err := row.Scan(&o.ID, &o.TenantID, &o.CartID, &o.TotalCents, &o.CreatedAt, &o.Version)
	return o, err
}

func decode(w http.ResponseWriter, r *http.Request) (orderInput, bool) {
	var in orderInput
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	err := dec.Decode(&in)
	if err == nil {
		err = in.validate()
	}
	if err != nil {
		httpidem.WriteError(w, r, &httpidem.Error{Status: http.StatusBadRequest, Err: errors.New("invalid order"), Detail: err.Error()})
		return in, false
	}
	return in, true
}

// fail answers an error: the helpers' refusals with their status, anything
// else as 500 (which rolls back a POST's work).
func (a *app) fail(w http.ResponseWriter, r *http.Request, err error) {
	if httpidem.StatusCode(err) >= 500 {
		a.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	httpidem.WriteError(w, r, err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
