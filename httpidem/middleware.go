// Package httpidem is the Idempotency-Key layer for HTTP APIs, on top of
// dedupe: net/http middleware for the server, a retrying http.RoundTripper
// for the client, and ETag/If-Match helpers for optimistic concurrency.
//
// The middleware claims (tenant, Idempotency-Key) atomically before the
// handler runs. A concurrent request with the same key gets 409 (nothing
// recorded, retry later), the same key with a different request 422, and a
// completed key the stored status, headers and body with
// "Idempotent-Replayed: true". Responses are buffered and sent only after
// the commit.
//
// In transactional mode (the default) the claim is inserted in the request's
// transaction, the one Tx returns: the claim, the handler's writes and the
// stored response commit together, in one transaction: BEGIN and the claim
// cost one round trip, and over a pgx pool the stored response and COMMIT
// another. A concurrent duplicate waits for the holder at
// most Config.LockTimeout (100 ms by default) and then answers 409. In leased
// mode (Config.Mode, Middleware.Leased), for handlers with effects outside
// the database, the claim commits first as in flight with a lease (90 s by
// default), so that a duplicate answers 409 at once and a process that died
// mid-request blocks the key only until the lease ends; the handler's
// transaction, if it opens one, commits with the stored response.
//
// In both modes a 5xx answer or a panic rolls the handler's work back and
// stores the error response (see ServerErrorPolicy). A client is never
// answered a success for work that did not commit: a handler that returns
// after its context ended (the client went away, or it ran past the lease,
// see Config.Inbox), or that writes an error status after a success status,
// is not stored, whatever it answered; its work is rolled back, the key is
// released, and the client gets a retryable 503 with Retry-After
// (ErrRolledBack) in place of a success. A COMMIT whose reply was lost is resolved on a
// fresh connection: a committed request answers with its response, one that
// did not commit or cannot be resolved answers 503 (retryable), never
// claiming that the work was rolled back when it may not have been. Keys are
// kept 24 h by default and purged with Middleware.Purge or
// Middleware.RunPurger.
//
// The middleware runs on a pgx pool, whose handlers take the request
// transaction with Tx, or on database/sql (New over dedupe.SQL(db)), whose
// handlers take it with SQLTx, a *sql.Tx: both modes and every guarantee
// above hold on either; over database/sql, BEGIN, the lock timeout, the claim
// and the savepoint are sent one after the other rather than in one round
// trip, and a handler that ends its *sql.Tx itself (its Commit or Rollback,
// or a statement) is found out before anything of it is stored (see SQLTx).
//
// Responses over Config.MaxResponseBytes (1 MiB by default) are refused:
// the work is rolled back, the key released and 500 answered
// (OversizeRefuse). With OversizeStoreHead the work commits, this client
// gets the full body and replays get the status and headers only, marked
// "Idempotent-Body-Omitted: true".
package httpidem

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// Middleware makes handlers idempotent per Idempotency-Key. It is safe for
// concurrent use; build one and wrap every route with Handler.
type Middleware struct {
	inbox       *dedupe.Inbox
	db          dedupe.DB // as given to New
	be          backend   // the database client: pgx or database/sql
	cfg         Config
	required    bool
	mode        Mode
	lockTimeout string // Config.LockTimeout as a setting
}

// pgxDB is what the middleware runs its transactions on over pgx: a pgx
// pool.
type pgxDB interface {
	dedupe.Querier
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// New returns a Middleware storing its keys through db: a *pgxpool.Pool,
// whose handlers get their transaction with Tx, or a database/sql handle
// wrapped with dedupe.SQL, whose handlers get theirs with SQLTx. The zero
// Config is the defaults. New does not touch the database; call Migrate
// once before serving.
func New(db dedupe.DB, cfg Config) (*Middleware, error) {
	if db == nil {
		return nil, &dedupe.ConfigError{Field: "db", Reason: "must not be nil"}
	}
	be, ok := newBackend(db)
	if !ok {
		return nil, &dedupe.ConfigError{Field: "db", Reason: fmt.Sprintf("httpidem needs a pgx pool or a database/sql handle wrapped with dedupe.SQL, not %T", db)}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	inbox, err := dedupe.New(db, c.Inbox)
	if err != nil {
		return nil, fmt.Errorf("httpidem: %w", err)
	}
	c.Inbox = inbox.Config()
	return &Middleware{inbox: inbox, db: db, be: be, cfg: c, required: c.KeyRequired, mode: c.Mode,
		lockTimeout: lockTimeoutSetting(c.LockTimeout)}, nil
}

// Migrate creates or upgrades the key table (Config.Inbox). It is
// idempotent and safe to run from many processes at once.
func (m *Middleware) Migrate(ctx context.Context) error {
	return dedupe.Migrate(ctx, m.db, m.cfg.Inbox.Migration())
}

// Inbox returns the inbox holding the keys, for operators (Lookup, Release,
// Stats).
func (m *Middleware) Inbox() *dedupe.Inbox { return m.inbox }

// Config returns the configuration with defaults filled in.
func (m *Middleware) Config() Config { return m.cfg }

// Required returns a Middleware sharing m's store whose routes refuse a
// request without a key (400).
func (m *Middleware) Required() *Middleware { c := *m; c.required = true; return &c }

// Optional returns a Middleware sharing m's store whose routes pass a
// request without a key straight through.
func (m *Middleware) Optional() *Middleware { c := *m; c.required = false; return &c }

// Leased returns a Middleware sharing m's store whose routes run in leased
// mode: for handlers with effects outside the database.
func (m *Middleware) Leased() *Middleware { c := *m; c.mode = Leased; return &c }

// Transactional returns a Middleware sharing m's store whose routes run in
// transactional mode.
func (m *Middleware) Transactional() *Middleware { c := *m; c.mode = Transactional; return &c }

// Handler wraps next. Requests whose method is not in Config.Methods pass
// straight through, and so do requests without a key on an optional route.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(m.cfg.Methods, r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, next)
	})
}

// HandlerFunc is Handler for a function.
func (m *Middleware) HandlerFunc(next http.HandlerFunc) http.Handler { return m.Handler(next) }
