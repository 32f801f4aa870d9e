package httpidem_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// order is the test handler's request body; its flags inject faults.
type order struct {
	CartID     string `json:"cart_id"`
	TotalCents int    `json:"total_cents"`
	Fail       bool   `json:"fail,omitempty"`   // insert, then answer 500
	Panic      bool   `json:"panic,omitempty"`  // insert, then panic
	Block      bool   `json:"block,omitempty"`  // insert, then wait on bundle.unblock
	Kill       bool   `json:"kill,omitempty"`   // once per bundle: insert, then pg_terminate_backend the tx's connection
	Big        int    `json:"big,omitempty"`    // pad the response with this many bytes
	Abort      bool   `json:"abort,omitempty"`  // once per bundle: insert, then panic(http.ErrAbortHandler)
	WaitCtx    bool   `json:"wait,omitempty"`   // once per bundle: wait for the request context to end, then fail
	Late       int    `json:"late,omitempty"`   // once per bundle: insert, wait for the request context to end, answer this status
	EndTx      string `json:"end_tx,omitempty"` // once per bundle: insert, send this statement (database/sql: call Commit or Rollback), insert again
}

type created struct {
	ID  int64  `json:"id"`
	Pad string `json:"pad,omitempty"`
}

// driver is the database client a test's middleware runs on.
type driver string

const (
	pgxDriver driver = "pgx"          // a *pgxpool.Pool; handlers use httpidem.Tx
	sqlDriver driver = "database/sql" // dedupe.SQL over pgx's stdlib; handlers use httpidem.SQLTx
)

// drivers are the clients the middleware runs on; its key guarantees are
// tested on both.
var drivers = []driver{pgxDriver, sqlDriver}

// open returns the middleware's DB on url for d, closed when the test ends.
func (d driver) open(t testing.TB, url string, maxConns int) dedupe.DB {
	t.Helper()
	switch d {
	case sqlDriver:
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(maxConns)
		t.Cleanup(func() { _ = db.Close() })
		return dedupe.SQL(db)
	default:
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = int32(maxConns)
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
}

// forDrivers runs f as a parallel subtest per driver.
func forDrivers(t *testing.T, f func(t *testing.T, drv driver)) {
	for _, drv := range drivers {
		t.Run(string(drv), func(t *testing.T) {
			t.Parallel()
			f(t, drv)
		})
	}
}

// forDriversModes runs f as a parallel subtest per driver and mode.
func forDriversModes(t *testing.T, f func(t *testing.T, drv driver, mode httpidem.Mode)) {
	forDrivers(t, func(t *testing.T, drv driver) {
		forModes(t, func(t *testing.T, mode httpidem.Mode) { f(t, drv, mode) })
	})
}

// forDriversModesAtOnce runs f as forDriversModes does, but its subtests
// all at once, outside -parallel's limit: for a test whose time is a wait
// on the wall clock inside the library (not work for the CPU or the
// database), so that the waits overlap rather than take turns for the
// package's few parallel slots.
func forDriversModesAtOnce(t *testing.T, f func(t *testing.T, drv driver, mode httpidem.Mode)) {
	var wg sync.WaitGroup
	for _, drv := range drivers {
		wg.Go(func() {
			t.Run(string(drv), func(t *testing.T) {
				var inner sync.WaitGroup
				for _, mode := range modes {
					inner.Go(func() { t.Run(mode.String(), func(t *testing.T) { f(t, drv, mode) }) })
				}
				inner.Wait()
			})
		})
	}
	wg.Wait()
}

// bundle is what setup gives each test.
type bundle struct {
	drv     driver
	db      *dbtest.DB
	mw      *httpidem.Middleware
	clock   *dbtest.Clock
	handler http.Handler // the middleware around the orders handler
	calls   atomic.Int64 // how often the orders handler ran
	killed  atomic.Bool
	aborted atomic.Bool
	waited  atomic.Bool
	lated   atomic.Bool
	ended   atomic.Bool
	endErr  atomic.Pointer[error]    // what the insert after EndTx returned
	txErrs  atomic.Pointer[[2]error] // what Commit and Rollback returned
	blocked chan struct{}
	unblock chan struct{}
}

// setup migrates a fresh schema with an orders table and returns the
// middleware (tenant from X-Tenant-ID, clock under the test's control)
// around a transactional orders handler, on a pgx pool.
func setup(t testing.TB, cfg ...httpidem.Config) *bundle {
	t.Helper()
	return setupOn(t, pgxDriver, cfg...)
}

// setupOn is setup with the middleware on drv.
func setupOn(t testing.TB, drv driver, cfg ...httpidem.Config) *bundle {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 6})
	clock := dbtest.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	var c httpidem.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	if c.Inbox.Clock == nil {
		c.Inbox.Clock = clock.Now
	}
	if c.Logger == nil {
		c.Logger = testLogger(t)
	}
	if c.Tenant == nil {
		c.Tenant = func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant-ID"), nil }
	}
	var mdb dedupe.DB = db.Pool
	if drv != pgxDriver {
		mdb = drv.open(t, db.URL, 6)
	}
	mw, err := httpidem.New(mdb, c)
	if err != nil {
		t.Fatalf("new middleware: %v", err)
	}
	if err := mw.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	db.Exec(t, `CREATE TABLE orders (id bigserial PRIMARY KEY, tenant_id text NOT NULL, cart_id text NOT NULL,
		total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`)
	b := &bundle{drv: drv, db: db, mw: mw, clock: clock, blocked: make(chan struct{}, 16), unblock: make(chan struct{})}
	b.handler = mw.Handler(http.HandlerFunc(b.createOrder))
	return b
}

// handlerTx is the request transaction as the orders handler uses it, on
// either driver.
type handlerTx struct {
	dedupe.Querier
	sql *sql.Tx // database/sql only
	// pgx is the pgx.Tx, whose Commit and Rollback the middleware must
	// refuse (nil over database/sql: a *sql.Tx cannot be guarded).
	pgx pgx.Tx
}

// requestTx returns the request transaction of ctx through the driver's
// accessor: httpidem.Tx or httpidem.SQLTx.
func (b *bundle) requestTx(ctx context.Context) (handlerTx, error) {
	if b.drv == sqlDriver {
		tx, err := httpidem.SQLTx(ctx)
		if err != nil {
			return handlerTx{}, err
		}
		return handlerTx{Querier: dedupe.SQLTx(tx), sql: tx}, nil
	}
	tx, err := httpidem.Tx(ctx)
	if err != nil {
		return handlerTx{}, err
	}
	return handlerTx{Querier: tx, pgx: tx}, nil
}

// createOrder inserts an order through the request transaction.
func (b *bundle) createOrder(w http.ResponseWriter, r *http.Request) {
	b.calls.Add(1)
	var in order
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tx, err := b.requestTx(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var out created
	if err := tx.QueryRow(r.Context(), `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ($1, $2, $3) RETURNING id`,
		r.Header.Get("X-Tenant-ID"), in.CartID, in.TotalCents).Scan(&out.ID); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	switch {
	case in.Fail:
		http.Error(w, "payment provider down", http.StatusInternalServerError)
		return
	case in.Panic:
		panic("handler bug")
	case in.Block:
		b.blocked <- struct{}{}
		<-b.unblock
	case in.Abort && b.aborted.CompareAndSwap(false, true):
		panic(http.ErrAbortHandler)
	case in.Late != 0 && b.lated.CompareAndSwap(false, true):
		b.blocked <- struct{}{}
		<-r.Context().Done()
		w.WriteHeader(in.Late) // e.g. 408 or 499, after the client went away
		return
	case in.EndTx != "" && b.ended.CompareAndSwap(false, true):
		var err error
		switch {
		case tx.sql != nil && in.EndTx == "COMMIT": // a *sql.Tx's own end, unguarded
			err = tx.sql.Commit()
		case tx.sql != nil:
			err = tx.sql.Rollback()
		default:
			_, err = tx.Exec(r.Context(), in.EndTx)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, err = tx.Exec(r.Context(), `INSERT INTO orders (tenant_id, cart_id, total_cents) VALUES ($1, $2, $3)`,
			r.Header.Get("X-Tenant-ID"), in.CartID+"-after", in.TotalCents)
		b.endErr.Store(&err)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	case in.WaitCtx && b.waited.CompareAndSwap(false, true):
		b.blocked <- struct{}{}
		<-r.Context().Done()
		if _, err := tx.Exec(r.Context(), "SELECT 1"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	case in.Kill && b.killed.CompareAndSwap(false, true):
		var pid uint32
		if err := tx.QueryRow(r.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := b.db.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	if tx.pgx != nil {
		cerr, rerr := tx.pgx.Commit(r.Context()), tx.pgx.Rollback(r.Context())
		b.txErrs.Store(&[2]error{cerr, rerr})
		if !errors.Is(cerr, httpidem.ErrTxManaged) || !errors.Is(rerr, httpidem.ErrTxManaged) {
			http.Error(w, fmt.Sprintf("Commit, Rollback returned %v, %v; want ErrTxManaged", cerr, rerr), http.StatusInternalServerError)
			return
		}
	}
	if in.Big > 0 {
		out.Pad = string(bytes.Repeat([]byte("x"), in.Big))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(out.ID, 10))
	w.Header().Set("X-Not-Stored", "1")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(out)
}

// reply is one answer as the tests look at it.
type reply struct {
	status   int
	header   http.Header
	body     []byte
	replayed bool
	id       int64
}

// post sends a POST /orders through the middleware (no network).
func (b *bundle) post(t testing.TB, tenant, key string, in any) reply {
	t.Helper()
	payload, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(payload))
	if tenant != "" {
		r.Header.Set("X-Tenant-ID", tenant)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	b.handler.ServeHTTP(w, r)
	return toReply(t, w.Result())
}

func toReply(t testing.TB, resp *http.Response) reply {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	rp := reply{status: resp.StatusCode, header: resp.Header, body: body, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if resp.StatusCode == http.StatusCreated && len(body) > 0 {
		var c created
		if err := json.Unmarshal(body, &c); err != nil {
			t.Fatalf("decode %q: %v", body, err)
		}
		rp.id = c.ID
	}
	return rp
}

func (b *bundle) orders(t testing.TB, tenant string) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM orders WHERE tenant_id = $1", tenant)
}

// testLogger sends the middleware's logs to the test's log, shown on
// failure or with -v.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	line := string(p)
	if i := strings.Index(line, " stack="); i > 0 {
		line = line[:i] // the panic's stack is noise here
	}
	w.t.Log(strings.TrimSpace(line))
	return len(p), nil
}

// modes are the middleware's modes; most guarantees are tested in both.
var modes = []httpidem.Mode{httpidem.Transactional, httpidem.Leased}

// forModes runs f as a parallel subtest per mode.
func forModes(t *testing.T, f func(t *testing.T, mode httpidem.Mode)) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			f(t, mode)
		})
	}
}

// viaProxy points the bundle's handler at a new middleware (cfg), on the
// bundle's driver, whose connections pass through a PostgreSQL-protocol
// proxy applying policy.
func (b *bundle) viaProxy(t *testing.T, policy pgproxy.Policy, cfg httpidem.Config) (dedupe.DB, *pgproxy.Proxy) {
	t.Helper()
	var (
		pool dedupe.DB
		p    *pgproxy.Proxy
	)
	if b.drv == sqlDriver {
		pool, p = sqlProxyDB(t, b.db.URL, policy)
	} else {
		pool, p = dbtest.ProxyPool(t, b.db.URL, policy)
	}
	if cfg.Inbox.Clock == nil {
		cfg.Inbox.Clock = b.clock.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.Tenant == nil {
		cfg.Tenant = func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant-ID"), nil }
	}
	mw, err := httpidem.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.handler = mw.Handler(http.HandlerFunc(b.createOrder))
	return pool, p
}

// sqlProxyDB is dbtest.ProxyPool for database/sql: a handle over pgx's
// stdlib whose connections pass through the proxy, wrapped with dedupe.SQL.
func sqlProxyDB(t *testing.T, url string, policy pgproxy.Policy) (*dedupe.SQLDB, *pgproxy.Proxy) {
	t.Helper()
	u, p := dbtest.ProxyURL(t, url, policy)
	return sqlDriver.open(t, u, 8).(*dedupe.SQLDB), p
}

// refusalLog is an ErrorHandler that keeps the middleware's refusals.
type refusalLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *refusalLog) handle(w http.ResponseWriter, r *http.Request, err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
	httpidem.WriteError(w, r, err)
}

func (l *refusalLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// together runs f in n goroutines released at the same instant and waits.
func together(n int, f func(i int)) { dbtest.Together(n, f) }
