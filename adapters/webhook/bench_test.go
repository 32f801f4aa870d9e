package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// handWritten is what one writes without the package: verify GitHub's
// signature, then claim the hash of the signed body (the delivery id is not
// signed) and insert the effect in one transaction.
func handWritten(db *dbtest.DB, secret string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		sig, ok := strings.CutPrefix(r.Header.Get("X-Hub-Signature-256"), "sha256=")
		got, err := hex.DecodeString(sig)
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(body)
		if !ok || err != nil || !hmac.Equal(got, m.Sum(nil)) {
			http.Error(w, "invalid signature", http.StatusBadRequest)
			return
		}
		id := r.Header.Get("X-GitHub-Delivery")
		sum := sha256.Sum256(body)
		key := hex.EncodeToString(sum[:])
		ctx := r.Context()
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		var claimed bool
		err = tx.QueryRow(ctx, `INSERT INTO hand_inbox (scope, key) VALUES ('github', $1)
			ON CONFLICT DO NOTHING RETURNING true`, key).Scan(&claimed)
		if err == pgx.ErrNoRows {
			_, _ = io.WriteString(w, "duplicate\n")
			return
		}
		if err == nil {
			_, err = tx.Exec(ctx, "INSERT INTO effects (provider, event_id, event_type) VALUES ('github', $1, $2)",
				id, r.Header.Get("X-GitHub-Event"))
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			http.Error(w, "handler failed", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "processed\n")
	})
}

// round counts the runs of BenchmarkGitHubReceiver in this process, and
// run the runs of its sub-benchmarks.
var round, run int

// BenchmarkGitHubReceiver compares the package's GitHub receiver with the
// hand-written equivalent above, for new events and for duplicates, calling
// ServeHTTP directly (no network) on a real PostgreSQL. The ratios are
// logged: webhook ns/op divided by hand-written ns/op.
func BenchmarkGitHubReceiver(b *testing.B) {
	db := dbtest.New(b, dbtest.Options{MaxConns: 4})
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		b.Fatal(err)
	}
	db.Exec(b, `CREATE TABLE effects (id bigserial PRIMARY KEY, provider text, event_id text, event_type text)`)
	db.Exec(b, `CREATE TABLE hand_inbox (scope text, key text, created_at timestamptz DEFAULT now(), PRIMARY KEY (scope, key))`)
	inbox, err := dedupe.New(db.Pool, dedupe.Config{})
	if err != nil {
		b.Fatal(err)
	}
	pkg, err := webhook.NewGitHub(inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}}, record)
	if err != nil {
		b.Fatal(err)
	}
	receivers := []struct {
		name string
		h    http.Handler
	}{{"handwritten", handWritten(db, githubSecret)}, {"webhook", pkg}}

	// Each event's body carries its own id, as GitHub's do.
	send := func(b *testing.B, h http.Handler, id string, want string) {
		body := []byte(`{"ref":"refs/heads/main","after":"` + id + `","commits":[{"id":"abc","message":"fix"}]}`)
		req := httptest.NewRequest(http.MethodPost, "/webhooks/github", strings.NewReader(string(body)))
		req.Header.Set("X-Hub-Signature-256", githubHeader(githubSecret, body))
		req.Header.Set("X-GitHub-Delivery", id)
		req.Header.Set("X-GitHub-Event", "push")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != want {
			b.Fatalf("%s: %d %q, want %s", id, rec.Code, rec.Body.String(), want)
		}
	}
	// Every run (-count rounds, b.N probes) gets ids of its own, so that a
	// "new" event is new in every round.
	round++
	perOp := map[string]time.Duration{}
	for _, kind := range []string{"new", "duplicate"} {
		for _, r := range receivers {
			b.Run(kind+"/"+r.name, func(b *testing.B) {
				run++
				dup := fmt.Sprintf("dup-%s-%d-%d", r.name, round, run)
				if kind == "duplicate" {
					send(b, r.h, dup, "processed")
				}
				n := 0
				for b.Loop() {
					n++
					if kind == "new" {
						send(b, r.h, fmt.Sprintf("%s-%d-%d-%d", r.name, round, run, n), "processed")
					} else {
						send(b, r.h, dup, "duplicate")
					}
				}
				perOp[kind+"/"+r.name] = b.Elapsed() / time.Duration(max(n, 1))
				if hw := perOp[kind+"/handwritten"]; r.name == "webhook" && hw > 0 {
					b.ReportMetric(float64(perOp[kind+"/webhook"])/float64(hw), "x-handwritten")
				}
			})
		}
	}
	for _, kind := range []string{"new", "duplicate"} {
		hw, pk := perOp[kind+"/handwritten"], perOp[kind+"/webhook"]
		if hw > 0 && pk > 0 {
			b.Logf("%s events: webhook %v/op, hand-written %v/op, ratio %.2f", kind, pk, hw, float64(pk)/float64(hw))
		}
	}
}
