package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// now is the receivers' clock in every test.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

// bundle is what setup gives each test.
type bundle struct {
	db    *dbtest.DB
	inbox *dedupe.Inbox
}

// setup migrates a fresh schema with an effects table.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 8})
	if err := dedupe.Migrate(context.Background(), db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	db.Exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, provider text, event_id text, event_type text)`)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, inbox: inbox}
}

func (b *bundle) effects(t *testing.T) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM effects")
}

func (b *bundle) inboxRows(t *testing.T) int {
	t.Helper()
	return b.db.Count(t, "SELECT count(*) FROM dedupe_inbox")
}

// record is the handlers' effect: one row per processed event.
func record(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (provider, event_id, event_type) VALUES ($1, $2, $3)",
		ev.Provider, ev.ID, ev.Type)
	return err
}

// together runs f in n goroutines released at the same instant and waits.
func together(n int, f func(i int)) { dbtest.Together(n, f) }

// The signers below compute signatures with crypto/hmac directly, following
// each provider's documentation, independently of the package's code.

func hmacSHA256(key, msg []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return m.Sum(nil)
}

// stripeHeader signs body as Stripe does: t=<ts>,v1=hex(HMAC(secret, "<ts>.<body>")).
func stripeHeader(ts time.Time, body []byte, secrets ...string) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	h := "t=" + t
	for _, s := range secrets {
		h += ",v1=" + hex.EncodeToString(hmacSHA256([]byte(s), []byte(t+"."+string(body))))
	}
	return h
}

// githubHeader signs body as GitHub does: sha256=hex(HMAC(secret, body)).
func githubHeader(secret string, body []byte) string {
	return "sha256=" + hex.EncodeToString(hmacSHA256([]byte(secret), body))
}

// standardHeader signs as Standard Webhooks does:
// v1,base64(HMAC(base64decode(secret minus whsec_), "<id>.<ts>.<body>")).
func standardHeader(secret, id string, ts time.Time, body []byte) string {
	key, err := base64.StdEncoding.DecodeString(secret[len("whsec_"):])
	if err != nil {
		panic(err)
	}
	msg := id + "." + strconv.FormatInt(ts.Unix(), 10) + "." + string(body)
	return "v1," + base64.StdEncoding.EncodeToString(hmacSHA256(key, []byte(msg)))
}

// post sends one delivery to srv and returns the status and body.
func post(t *testing.T, url string, header http.Header, body []byte) (int, string, http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v // as given: lets tests send non-canonical names
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("post: %v", err)
		return 0, "", nil
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(text), resp.Header
}

// serve starts h on a loopback test server.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return srv
}
