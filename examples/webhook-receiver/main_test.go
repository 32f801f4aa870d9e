package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

const (
	stripeSecret   = "whsec_example_stripe"
	githubSecret   = "example-github-secret"
	standardSecret = "whsec_ZXhhbXBsZSBzdGFuZGFyZCB3ZWJob29rcyBrZXk=" // base64("example standard webhooks key")
)

var quiet = slog.New(slog.DiscardHandler)

func mac(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// delivery is one signed request as each provider documents it.
type delivery struct {
	path   string
	header http.Header
	body   string
}

func stripeEvent(id, typ string) delivery {
	body := `{"id":"` + id + `","object":"event","type":"` + typ + `"}`
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	return delivery{"/webhooks/stripe", http.Header{
		"Stripe-Signature": {"t=" + ts + ",v1=" + hex.EncodeToString(mac([]byte(stripeSecret), ts+"."+body))},
	}, body}
}

func githubEvent(id, typ string) delivery {
	body := `{"zen":"Design for failure."}`
	return delivery{"/webhooks/github", http.Header{
		"X-Hub-Signature-256": {"sha256=" + hex.EncodeToString(mac([]byte(githubSecret), body))},
		"X-Github-Delivery":   {id},
		"X-Github-Event":      {typ},
	}, body}
}

func standardEvent(id, typ string) delivery {
	body := `{"type":"` + typ + `","data":{}}`
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(standardSecret, "whsec_"))
	return delivery{"/webhooks/standard", http.Header{
		"Webhook-Id": {id}, "Webhook-Timestamp": {ts},
		"Webhook-Signature": {"v1," + base64.StdEncoding.EncodeToString(mac(key, id+"."+ts+"."+body))},
	}, body}
}

func send(t *testing.T, base string, d delivery) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+d.path, strings.NewReader(d.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = d.header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("post %s: %v", d.path, err)
		return 0, ""
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(text))
}

func TestReceiverRecordsEachEventOnce(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	for range 2 { // a restart finds everything in place
		if err := Setup(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
	}
	mux, err := NewMux(db.Pool, Secrets{Stripe: stripeSecret, GitHub: githubSecret, Standard: standardSecret}, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer http.DefaultClient.CloseIdleConnections()

	events := []delivery{
		stripeEvent("evt_1", "invoice.paid"),
		githubEvent("72d3162e-cc78-11e3-81ab-4c9367dc0958", "push"),
		standardEvent("msg_1", "user.created"),
	}
	// Each provider re-sends its event: 10 deliveries at once, then again.
	for _, d := range events {
		const n = 10
		statuses := make([]int, n)
		dbtest.Together(n, func(i int) { statuses[i], _ = send(t, srv.URL, d) })
		for i, s := range statuses {
			if s != http.StatusOK {
				t.Errorf("%s delivery %d: %d, want 200", d.path, i, s)
			}
		}
		if s, text := send(t, srv.URL, d); s != 200 || text != "duplicate" {
			t.Errorf("%s redelivery: %d %q", d.path, s, text)
		}
	}
	// GitHub signs the body only: the same body under a made-up delivery id
	// is a replay, answered as a duplicate.
	if s, text := send(t, srv.URL, githubEvent("00000000-0000-0000-0000-000000000001", "push")); s != 200 || text != "duplicate" {
		t.Errorf("github replay under a new delivery id: %d %q, want 200 duplicate", s, text)
	}
	// A forged delivery and a wrong method are refused.
	forged := githubEvent("forged", "push")
	forged.body = `{"zen":"tampered"}`
	if s, text := send(t, srv.URL, forged); s != 400 || text != "invalid signature" {
		t.Errorf("forged: %d %q", s, text)
	}
	resp, err := http.Get(srv.URL + "/webhooks/stripe")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}

	rows, err := db.Pool.Query(ctx, `SELECT provider, event_id, event_type, received_at FROM webhook_events ORDER BY provider`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var p, id, typ string
		var at time.Time
		if err := rows.Scan(&p, &id, &typ, &at); err != nil {
			t.Fatal(err)
		}
		if time.Since(at) > time.Minute {
			t.Errorf("received_at %v", at)
		}
		got = append(got, p+" "+id+" "+typ)
	}
	want := []string{"github 72d3162e-cc78-11e3-81ab-4c9367dc0958 push", "standard msg_1 user.created", "stripe evt_1 invoice.paid"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("webhook_events =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	env := map[string]string{
		"DATABASE_URL":          db.URL,
		"ADDR":                  "127.0.0.1:0",
		"GITHUB_WEBHOOK_SECRET": githubSecret,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, func(k string) string { return env[k] }, quiet, func(a net.Addr) { addrc <- a })
	}()
	var base string
	select {
	case a := <-addrc:
		base = "http://" + a.String()
	case err := <-errc:
		t.Fatalf("run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not start")
	}
	if resp, err := http.Get(base + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %v, %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if s, text := send(t, base, githubEvent("d-1", "ping")); s != 200 || text != "processed" {
		t.Fatalf("github: %d %q", s, text)
	}
	// Stripe's secret is unset, so its route is not mounted.
	if s, _ := send(t, base, stripeEvent("evt_1", "x")); s != http.StatusNotFound {
		t.Fatalf("stripe without a secret: %d, want 404", s)
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("run returned %v after cancel", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not stop")
	}
	if n := db.Count(t, "SELECT count(*) FROM webhook_events WHERE provider = 'github' AND event_id = 'd-1'"); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
}

func TestRunRefusesIncompleteConfig(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	for name, env := range map[string]map[string]string{
		"bad database": {"DATABASE_URL": "postgres://%zz", "ADDR": "127.0.0.1:0", "GITHUB_WEBHOOK_SECRET": "s"},
		"no secret":    {"DATABASE_URL": db.URL, "ADDR": "127.0.0.1:0"},
		"bad secret":   {"DATABASE_URL": db.URL, "ADDR": "127.0.0.1:0", "STANDARD_WEBHOOK_SECRET": "whsec_%%%"},
	} {
		err := run(context.Background(), func(k string) string { return env[k] }, quiet, func(net.Addr) {
			t.Errorf("%s: run started", name)
		})
		if err == nil {
			t.Errorf("%s: run returned nil", name)
		}
	}
}
