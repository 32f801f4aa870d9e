package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// exampleInbox returns a migrated inbox in a fresh schema with an events
// table (see dbtest.ForExample), and the cleanup that drops the schema.
func exampleInbox() (*dedupe.Inbox, *pgxpool.Pool, func()) {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE events (id text, type text)`); err != nil {
		panic(err)
	}
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		panic(err)
	}
	return inbox, pool, cleanup
}

// deliver posts body with header to h as a provider would.
func deliver(h http.Handler, header http.Header, body string) string {
	req := httptest.NewRequest(http.MethodPost, "/webhooks", strings.NewReader(body))
	req.Header = header
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return strconv.Itoa(rec.Code) + " " + strings.TrimSpace(rec.Body.String())
}

// Stripe re-sends an event until it gets a 2xx; the second delivery is
// answered 200 without running the handler again.
func ExampleNewStripe() {
	inbox, _, cleanup := exampleInbox()
	defer cleanup()

	h, err := webhook.NewStripe(inbox, webhook.StripeConfig{
		Secrets: []string{"whsec_current", "whsec_previous"}, // rotation: both accepted
		Config:  webhook.Config{Endpoint: "payments"},
	}, func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
		var obj struct {
			Data struct {
				Object struct{ Amount int } `json:"object"`
			} `json:"data"`
		}
		if err := ev.Decode(&obj); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO events VALUES ($1, $2)`, ev.ID, ev.Type)
		return err
	})
	if err != nil {
		panic(err)
	}
	// A server mounts it: mux.Handle("POST /webhooks/stripe", h)

	body := `{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"amount":1900}}}`
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte("whsec_current"))
	mac.Write([]byte(ts + "." + body))
	header := http.Header{"Stripe-Signature": {"t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))}}

	fmt.Println(deliver(h, header, body))
	fmt.Println(deliver(h, header, body))
	forged := hmac.New(sha256.New, []byte("whsec_guessed"))
	forged.Write([]byte(ts + "." + body))
	fmt.Println(deliver(h, http.Header{"Stripe-Signature": {"t=" + ts + ",v1=" + hex.EncodeToString(forged.Sum(nil))}}, body))
	// Output:
	// 200 processed
	// 200 duplicate
	// 400 invalid signature
}

// GitHub signs the body only, so the key is the body's hash (GitHubKey):
// a redelivery and a replay under another delivery id are both duplicates.
// The delivery id and the event type come in headers.
func ExampleNewGitHub() {
	inbox, pool, cleanup := exampleInbox()
	defer cleanup()

	h, err := webhook.NewGitHub(inbox, webhook.GitHubConfig{Secrets: []string{"gh-secret"}},
		func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO events VALUES ($1, $2)`, ev.ID, ev.Type)
			return err
		})
	if err != nil {
		panic(err)
	}
	body := `{"ref":"refs/heads/main"}`
	mac := hmac.New(sha256.New, []byte("gh-secret"))
	mac.Write([]byte(body))
	header := http.Header{
		"X-Hub-Signature-256": {"sha256=" + hex.EncodeToString(mac.Sum(nil))},
		"X-Github-Delivery":   {"72d3162e-cc78-11e3-81ab-4c9367dc0958"},
		"X-Github-Event":      {"push"},
	}
	fmt.Println(deliver(h, header, body))
	fmt.Println(deliver(h, header, body)) // "Redeliver" in GitHub's settings
	replay := header.Clone()
	replay.Set("X-Github-Delivery", "00000000-0000-0000-0000-000000000001")
	fmt.Println(deliver(h, replay, body)) // the signed body under a made-up id

	var n int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE type = 'push'`).Scan(&n)
	fmt.Println("rows:", n, "key:", webhook.GitHubKey([]byte(body))[:15]+"…")
	// Output:
	// 200 processed
	// 200 duplicate
	// 200 duplicate
	// rows: 1 key: sha256:090ba1b9…
}

// Standard Webhooks (Svix and others) sign "<id>.<timestamp>.<body>" with
// the base64 key of a whsec_ secret.
func ExampleNewStandard() {
	inbox, _, cleanup := exampleInbox()
	defer cleanup()

	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a 24-byte example key..."))
	h, err := webhook.NewStandard(inbox, webhook.StandardConfig{Secrets: []string{secret}},
		func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO events VALUES ($1, $2)`, ev.ID, ev.Type)
			return err
		})
	if err != nil {
		panic(err)
	}
	body := `{"type":"user.created","data":{"id":"u_1"}}`
	sign := func(ts time.Time) http.Header {
		t := strconv.FormatInt(ts.Unix(), 10)
		key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte("msg_1." + t + "." + body))
		return http.Header{"Webhook-Id": {"msg_1"}, "Webhook-Timestamp": {t},
			"Webhook-Signature": {"v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))}}
	}
	fmt.Println(deliver(h, sign(time.Now().Add(-10*time.Minute)), body)) // a replay
	fmt.Println(deliver(h, sign(time.Now()), body))
	fmt.Println(deliver(h, sign(time.Now()), body))
	// Output:
	// 400 timestamp outside tolerance
	// 200 processed
	// 200 duplicate
}

// A sender with its own scheme: base64 HMAC-SHA256 in X-Acme-Signature, the
// event id in the JSON body, and OnError to see why deliveries were refused.
func ExampleNewHMAC() {
	inbox, _, cleanup := exampleInbox()
	defer cleanup()

	h, err := webhook.NewHMAC(inbox, webhook.HMACConfig{
		HMACVerifier: webhook.HMACVerifier{
			Name:            "acme",
			Secrets:         []string{"acme-secret"},
			SignatureHeader: "X-Acme-Signature",
			Encoding:        webhook.EncodingBase64,
			IDField:         "event.id",
			TypeField:       "event.type",
		},
		Config: webhook.Config{OnError: func(r *http.Request, status int, err error) {
			var se *webhook.SignatureError
			if errors.As(err, &se) {
				fmt.Println("refused:", se.Header, errors.Is(err, webhook.ErrSignatureMismatch))
			}
		}},
	}, func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO events VALUES ($1, $2)`, ev.ID, ev.Type)
		return err
	})
	if err != nil {
		panic(err)
	}
	body := `{"event":{"id":"ev_42","type":"order.paid"}}`
	mac := hmac.New(sha256.New, []byte("acme-secret"))
	mac.Write([]byte(body))
	good := http.Header{"X-Acme-Signature": {base64.StdEncoding.EncodeToString(mac.Sum(nil))}}
	fmt.Println(deliver(h, good, body))
	fmt.Println(deliver(h, good, strings.Replace(body, "paid", "refunded", 1)))
	// Output:
	// 200 processed
	// refused: X-Acme-Signature true
	// 400 invalid signature
}

// A sender that puts the event id in a header must sign it: SignedContent
// lays out the signed bytes, here "<id>.<timestamp>.<body>". The id of one
// signed delivery cannot be swapped for another's.
func ExampleNewHMAC_signedIDHeader() {
	inbox, _, cleanup := exampleInbox()
	defer cleanup()

	h, err := webhook.NewHMAC(inbox, webhook.HMACConfig{
		HMACVerifier: webhook.HMACVerifier{
			Name:            "acme",
			Secrets:         []string{"acme-secret"},
			SignatureHeader: "X-Acme-Signature",
			SignedContent:   "{id}.{timestamp}.{body}",
			IDHeader:        "X-Acme-Id",
			TimestampHeader: "X-Acme-Timestamp",
		},
		Config: webhook.Config{OnError: func(*http.Request, int, error) {}},
	}, func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO events VALUES ($1, $2)`, ev.ID, ev.Type)
		return err
	})
	if err != nil {
		panic(err)
	}
	body := `{"order":42}`
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte("acme-secret"))
	mac.Write([]byte("ev_1." + ts + "." + body))
	header := http.Header{"X-Acme-Id": {"ev_1"}, "X-Acme-Timestamp": {ts}, "X-Acme-Signature": {hex.EncodeToString(mac.Sum(nil))}}
	fmt.Println(deliver(h, header, body))
	header.Set("X-Acme-Id", "ev_2") // an attempt to claim ev_2 with ev_1's signature
	fmt.Println(deliver(h, header, body))

	// Without {id} in SignedContent, the id header is refused at once.
	_, err = webhook.NewHMAC(inbox, webhook.HMACConfig{HMACVerifier: webhook.HMACVerifier{
		Secrets: []string{"acme-secret"}, IDHeader: "X-Acme-Id"}},
		func(context.Context, pgx.Tx, webhook.Event) error { return nil })
	var ce *dedupe.ConfigError
	fmt.Println(errors.As(err, &ce), ce.Field)
	// Output:
	// 200 processed
	// 400 invalid signature
	// true IDHeader
}

// Parsing a Stripe-Signature header on its own, e.g. to log which scheme a
// sender used.
func ExampleParseStripeSignature() {
	sig, err := webhook.ParseStripeSignature("t=1492774577,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd,v0=6ffbb59b")
	fmt.Println(sig.Timestamp.UTC(), len(sig.V1), err)
	_, err = webhook.ParseStripeSignature("v1=5257a869")
	fmt.Println(errors.Is(err, webhook.ErrMalformedSignature))
	// Output:
	// 2017-04-21 11:36:17 +0000 UTC 1 <nil>
	// true
}

// slackVerifier is a Verifier for a provider the package does not know:
// Slack signs "v0:<timestamp>:<body>" and puts the event id in the body.
type slackVerifier struct{ secret string }

func (slackVerifier) Provider() string { return "slack" }

func (v slackVerifier) Verify(h http.Header, body []byte, now time.Time) (webhook.Event, error) {
	ts := h.Get("X-Slack-Request-Timestamp")
	mac := hmac.New(sha256.New, []byte(v.secret))
	mac.Write([]byte("v0:" + ts + ":" + string(body)))
	got, _ := hex.DecodeString(strings.TrimPrefix(h.Get("X-Slack-Signature"), "v0="))
	if !hmac.Equal(got, mac.Sum(nil)) {
		return webhook.Event{}, &webhook.SignatureError{Provider: "slack", Header: "X-Slack-Signature", Reason: webhook.ErrSignatureMismatch}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return webhook.Event{}, &webhook.SignatureError{Provider: "slack", Header: "X-Slack-Request-Timestamp", Reason: webhook.ErrStaleTimestamp}
	}
	var ev struct {
		EventID string                `json:"event_id"`
		Event   struct{ Type string } `json:"event"`
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.EventID == "" {
		return webhook.Event{}, &webhook.EventError{Provider: "slack", Field: "event_id", Reason: "missing"}
	}
	return webhook.Event{ID: ev.EventID, Type: ev.Event.Type, Timestamp: time.Unix(sec, 0)}, nil
}

// New takes any Verifier; the handler keeps the same responses and the
// same exactly-once claim.
func ExampleNew() {
	inbox, _, cleanup := exampleInbox()
	defer cleanup()

	h, err := webhook.New(inbox, slackVerifier{secret: "slack-signing-secret"}, webhook.Config{Endpoint: "workspace-1"},
		func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO events VALUES ($1, $2)`, ev.ID, ev.Type)
			return err
		})
	if err != nil {
		panic(err)
	}
	body := `{"event_id":"Ev08MFMKH6","event":{"type":"app_mention"}}`
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte("slack-signing-secret"))
	mac.Write([]byte("v0:" + ts + ":" + body))
	header := http.Header{"X-Slack-Request-Timestamp": {ts}, "X-Slack-Signature": {"v0=" + hex.EncodeToString(mac.Sum(nil))}}
	fmt.Println(h.Scope())
	fmt.Println(deliver(h, header, body))
	fmt.Println(deliver(h, header, body))
	// Output:
	// webhook:slack:workspace-1
	// 200 processed
	// 200 duplicate
}
