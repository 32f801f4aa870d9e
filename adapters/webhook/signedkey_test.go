package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
)

// These tests attack the dedup key: it must come only from what the
// signature covers, so that nobody holding one signed delivery can make it
// run again under another key, or make another event a duplicate.

// githubDelivery is a signed GitHub delivery of body under a delivery id.
func githubDelivery(id string, body []byte) http.Header {
	return http.Header{"X-Hub-Signature-256": {githubHeader(githubSecret, body)},
		"X-Github-Delivery": {id}, "X-Github-Event": {"pull_request"}}
}

// tally counts the responses by status and text.
func tally(statuses []int, texts []string) map[string]int {
	m := map[string]int{}
	for i := range statuses {
		m[strconv.Itoa(statuses[i])+" "+strings.TrimSpace(texts[i])]++
	}
	return m
}

// GitHub signs the body only: the same signed body replayed under fresh
// X-GitHub-Delivery ids, all at the same instant, has one effect.
func TestGitHubReplayUnderFreshDeliveryIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int64
	h, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}},
		func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
			runs.Add(1)
			time.Sleep(30 * time.Millisecond) // hold the claim while the replays arrive
			return record(ctx, tx, ev)
		})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	body := []byte(`{"action":"opened","pull_request":{"id":1001,"number":7}}`)
	const n = 16
	statuses, texts := make([]int, n), make([]string, n)
	together(n, func(i int) {
		statuses[i], texts[i], _ = post(t, srv.URL, githubDelivery(fmt.Sprintf("replay-%d", i), body), body)
	})
	if got := tally(statuses, texts); got["200 processed"] != 1 || got["200 duplicate"] != n-1 {
		t.Errorf("responses = %v, want 1 processed and %d duplicate", got, n-1)
	}
	// Later replays, under yet another id or one already used, change nothing.
	for _, id := range []string{"replay-later", "replay-0"} {
		if status, text, _ := post(t, srv.URL, githubDelivery(id, body), body); status != 200 || strings.TrimSpace(text) != "duplicate" {
			t.Errorf("replay under %s: %d %q, want 200 duplicate", id, status, text)
		}
	}
	if got := b.effects(t); got != 1 {
		t.Errorf("effects = %d, want 1", got)
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
}

// An unsigned delivery id decides nothing: an attacker who replays a signed
// body under the id GitHub will give the next event does not make that event
// a duplicate, alone or racing it.
func TestGitHubDeliveryIDCannotPreClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret}}, record)
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	old := []byte(`{"action":"opened","pull_request":{"id":1}}`)
	if status, text, _ := post(t, srv.URL, githubDelivery("d-1", old), old); status != 200 || strings.TrimSpace(text) != "processed" {
		t.Fatalf("genuine d-1: %d %q", status, text)
	}
	// The attacker replays the old body under the next delivery's id, first.
	if status, text, _ := post(t, srv.URL, githubDelivery("d-2", old), old); status != 200 || strings.TrimSpace(text) != "duplicate" {
		t.Errorf("replay under d-2: %d %q, want 200 duplicate", status, text)
	}
	fresh := []byte(`{"action":"closed","pull_request":{"id":2}}`)
	if status, text, _ := post(t, srv.URL, githubDelivery("d-2", fresh), fresh); status != 200 || strings.TrimSpace(text) != "processed" {
		t.Errorf("genuine d-2 after the pre-claim: %d %q, want 200 processed", status, text)
	}
	// Racing: many replays under d-3 fired with the genuine d-3.
	third := []byte(`{"action":"reopened","pull_request":{"id":3}}`)
	const n = 12
	statuses, texts := make([]int, n+1), make([]string, n+1)
	together(n+1, func(i int) {
		if i == n {
			statuses[i], texts[i], _ = post(t, srv.URL, githubDelivery("d-3", third), third)
			return
		}
		statuses[i], texts[i], _ = post(t, srv.URL, githubDelivery("d-3", old), old)
	})
	if statuses[n] != 200 || strings.TrimSpace(texts[n]) != "processed" {
		t.Errorf("genuine d-3 racing %d replays: %d %q, want 200 processed", n, statuses[n], texts[n])
	}
	if got := tally(statuses[:n], texts[:n]); got["200 duplicate"] != n {
		t.Errorf("replays under d-3: %v, want %d duplicate", got, n)
	}
	byID := map[string]int{}
	rows, err := b.db.Pool.Query(context.Background(), "SELECT event_id FROM effects")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		byID[id]++
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(byID) != 3 || byID["d-1"] != 1 || byID["d-2"] != 1 || byID["d-3"] != 1 {
		t.Errorf("effects by delivery id = %v, want d-1, d-2 and d-3 once each", byID)
	}
}

// A body whose key is marked failed stays failed under any delivery id: a
// replay cannot buy the handler more attempts.
func TestGitHubPoisonedBodyStaysFailedUnderNewIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	h, err := webhook.NewGitHub(b.inbox, webhook.GitHubConfig{Secrets: []string{githubSecret},
		Config: webhook.Config{MaxAttempts: 2, OnError: func(*http.Request, int, error) {}}},
		func(ctx context.Context, tx pgx.Tx, ev webhook.Event) error {
			calls.Add(1)
			return errors.New("cannot handle")
		})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	body := []byte(`{"action":"deleted","hook_id":9}`)
	for i, c := range []struct{ id, want string }{
		{"p-1", "handler failed"}, {"p-1", "event marked failed"}, {"p-2", "event marked failed"}, {"p-3", "event marked failed"},
	} {
		if status, text, _ := post(t, srv.URL, githubDelivery(c.id, body), body); status != 500 || strings.TrimSpace(text) != c.want {
			t.Errorf("delivery %d (%s): %d %q, want 500 %q", i+1, c.id, status, text, c.want)
		}
	}
	if calls.Load() != 2 {
		t.Errorf("handler ran %d times, want 2", calls.Load())
	}
}

// The generic receiver refuses an id header that the signature does not
// cover: with it, a valid signature for one body could claim any id.
func TestHMACUnsignedIDHeaderRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nop := func(context.Context, pgx.Tx, webhook.Event) error { return nil }
	for name, v := range map[string]webhook.HMACVerifier{
		"body signed":           {Secrets: []string{hmacSecret}, IDHeader: "X-Event-Id"},
		"timestamp.body signed": {Secrets: []string{hmacSecret}, IDHeader: "X-Event-Id", TimestampHeader: "X-Timestamp"},
	} {
		_, err := webhook.NewHMAC(b.inbox, webhook.HMACConfig{HMACVerifier: v}, nop)
		var ce *dedupe.ConfigError
		if !errors.Is(err, dedupe.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != "IDHeader" ||
			!strings.Contains(ce.Reason, "not covered by the signature") {
			t.Errorf("%s: NewHMAC = %v, want a *ConfigError on IDHeader saying it is not covered by the signature", name, err)
		}
		if _, err := webhook.New(b.inbox, &v, webhook.Config{}, nop); !errors.As(err, &ce) || ce.Field != "IDHeader" {
			t.Errorf("%s: New = %v, want the same refusal", name, err)
		}
		if _, err := v.Verify(http.Header{}, []byte(`{}`), now); !errors.As(err, &ce) || ce.Field != "IDHeader" {
			t.Errorf("%s: Verify = %v, want the same refusal", name, err)
		}
	}
}

// acme is a generic sender that puts the event id in a header and signs it.
var acme = webhook.HMACVerifier{Name: "acme", Secrets: []string{hmacSecret}, SignatureHeader: "X-Acme-Signature",
	SignedContent: "{id}.{timestamp}.{body}", TimestampHeader: "X-Acme-Timestamp", IDHeader: "X-Acme-Id", TypeField: "kind"}

// acmeDelivery signs body for id at now as acme does: hex HMAC-SHA256 of
// "<id>.<timestamp>.<body>".
func acmeDelivery(id string, body []byte) http.Header {
	ts := strconv.FormatInt(now.Unix(), 10)
	return http.Header{"X-Acme-Id": {id}, "X-Acme-Timestamp": {ts},
		"X-Acme-Signature": {hexMAC(hmacSecret, id+"."+ts+"."+string(body))}}
}

// An attacker who holds evt_1's signed delivery sends it with the id header
// evt_2, before and while the genuine evt_2 arrives: every forgery is
// refused and evt_2 is processed once, with its own body.
func TestHMACSignedIDCannotPreClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := webhook.NewHMAC(b.inbox, webhook.HMACConfig{HMACVerifier: acme,
		Config: webhook.Config{Clock: clock, OnError: func(*http.Request, int, error) {}}}, record)
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	paid := []byte(`{"kind":"order.paid","order":1}`)
	genuine1 := acmeDelivery("evt_1", paid)
	if status, text, _ := post(t, srv.URL, genuine1, paid); status != 200 || strings.TrimSpace(text) != "processed" {
		t.Fatalf("genuine evt_1: %d %q", status, text)
	}
	forge := func(id string) http.Header {
		h := genuine1.Clone()
		h.Set("X-Acme-Id", id)
		return h
	}
	if status, text, _ := post(t, srv.URL, forge("evt_2"), paid); status != 400 || strings.TrimSpace(text) != "invalid signature" {
		t.Errorf("evt_1's delivery under id evt_2: %d %q, want 400 invalid signature", status, text)
	}
	refunded := []byte(`{"kind":"order.refunded","order":1}`)
	if status, text, _ := post(t, srv.URL, acmeDelivery("evt_2", refunded), refunded); status != 200 || strings.TrimSpace(text) != "processed" {
		t.Errorf("genuine evt_2 after the forgery: %d %q, want 200 processed", status, text)
	}
	// Racing: forgeries under evt_3 fired with the genuine evt_3.
	shipped := []byte(`{"kind":"order.shipped","order":1}`)
	const n = 12
	statuses, texts := make([]int, n+1), make([]string, n+1)
	together(n+1, func(i int) {
		if i == n {
			statuses[i], texts[i], _ = post(t, srv.URL, acmeDelivery("evt_3", shipped), shipped)
			return
		}
		statuses[i], texts[i], _ = post(t, srv.URL, forge("evt_3"), paid)
	})
	if statuses[n] != 200 || strings.TrimSpace(texts[n]) != "processed" {
		t.Errorf("genuine evt_3 racing %d forgeries: %d %q, want 200 processed", n, statuses[n], texts[n])
	}
	if got := tally(statuses[:n], texts[:n]); got["400 invalid signature"] != n {
		t.Errorf("forgeries under evt_3: %v, want %d refused", got, n)
	}
	for id, typ := range map[string]string{"evt_1": "order.paid", "evt_2": "order.refunded", "evt_3": "order.shipped"} {
		if got := b.db.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1 AND event_type = $2", id, typ); got != 1 {
			t.Errorf("effects of %s with its own body = %d, want 1", id, got)
		}
	}
	if got := b.effects(t); got != 3 {
		t.Errorf("effects = %d, want 3", got)
	}
}

// The audit of every built-in verifier: whatever header of a signed
// delivery is changed (every one but the signature itself, and a new one
// added), the delivery is refused or keeps its key. So the key depends on
// signed material only.
func TestVerifierKeyOnlyFromSignedMaterial(t *testing.T) {
	t.Parallel()
	ts := strconv.FormatInt(now.Unix(), 10)
	stripeBody := []byte(`{"id":"evt_1","type":"invoice.paid"}`)
	standardBody := []byte(`{"type":"user.created"}`)
	acmeBody := []byte(`{"kind":"order.paid","event":{"id":"evt_body"}}`)
	cases := []struct {
		name    string
		v       webhook.Verifier
		h       http.Header
		body    []byte
		wantKey string
	}{
		{"stripe", &webhook.StripeVerifier{Secrets: []string{stripeSecret}},
			http.Header{"Stripe-Signature": {stripeHeader(now, stripeBody, stripeSecret)}}, stripeBody, "evt_1"},
		{"github", &webhook.GitHubVerifier{Secrets: []string{githubSecret}}, githubDelivery("d-1", githubBody("e")), githubBody("e"),
			webhook.GitHubKey(githubBody("e"))},
		{"standard", &webhook.StandardVerifier{Secrets: []string{standardSecret}}, http.Header{"Webhook-Id": {"msg_1"},
			"Webhook-Timestamp": {ts}, "Webhook-Signature": {standardHeader(standardSecret, "msg_1", now, standardBody)}}, standardBody, "msg_1"},
		{"svix", &webhook.StandardVerifier{Secrets: []string{standardSecret}}, http.Header{"Svix-Id": {"msg_1"},
			"Svix-Timestamp": {ts}, "Svix-Signature": {standardHeader(standardSecret, "msg_1", now, standardBody)}}, standardBody, "msg_1"},
		{"hmac, signed id header", &acme, acmeDelivery("evt_1", acmeBody), acmeBody, "evt_1"},
		{"hmac, id from the body", &webhook.HMACVerifier{Secrets: []string{hmacSecret}, TimestampHeader: "X-Acme-Timestamp",
			IDField: "event.id", TypeHeader: "X-Acme-Type"},
			http.Header{"X-Acme-Timestamp": {ts}, "X-Acme-Type": {"paid"}, "X-Signature": {hexMAC(hmacSecret, ts+"."+string(acmeBody))}},
			acmeBody, "evt_body"},
	}
	unsigned := []string{"X-Github-Delivery", "X-Github-Event", "X-Acme-Id", "Webhook-Id", "Svix-Id", "Idempotency-Key", "X-Request-Id"}
	for _, c := range cases {
		ev, err := c.v.Verify(c.h, c.body, now)
		if err != nil || ev.Key != c.wantKey {
			t.Errorf("%s: genuine delivery: key %q, %v; want %q", c.name, ev.Key, err, c.wantKey)
			continue
		}
		names := append([]string{}, unsigned...)
		for k := range c.h {
			names = append(names, k)
		}
		for _, k := range names {
			if strings.Contains(strings.ToLower(k), "signature") {
				continue
			}
			for _, val := range []string{"evt_2", "msg_2", c.h.Get(k) + "x", ""} {
				h := c.h.Clone()
				h.Set(k, val)
				if val == "" {
					h.Del(k)
				}
				got, err := c.v.Verify(h, c.body, now)
				if err == nil && got.Key != c.wantKey {
					t.Errorf("%s: %s set to %q: accepted with key %q, want refused or key %q", c.name, k, val, got.Key, c.wantKey)
				}
			}
		}
	}
}

// A SignedContent layout that does not bind every part of the event, or
// whose bytes could be read in two ways, is refused at construction.
func TestHMACSignedContentRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nop := func(context.Context, pgx.Tx, webhook.Event) error { return nil }
	base := webhook.HMACVerifier{Secrets: []string{hmacSecret}}
	with := func(content, tsHeader, idHeader string) webhook.HMACVerifier {
		v := base
		v.SignedContent, v.TimestampHeader, v.IDHeader = content, tsHeader, idHeader
		return v
	}
	cases := []struct {
		name  string
		v     webhook.HMACVerifier
		field string
		says  string
	}{
		{"id header unsigned", with("{timestamp}.{body}", "X-Ts", "X-Id"), "IDHeader", "not covered by the signature"},
		{"timestamp header unsigned", with("{id}.{body}", "X-Ts", "X-Id"), "TimestampHeader", "not covered by the signature"},
		{"{id} without IDHeader", with("{id}.{body}", "", ""), "SignedContent", "needs IDHeader"},
		{"{timestamp} without TimestampHeader", with("{timestamp}.{body}", "", ""), "SignedContent", "needs TimestampHeader"},
		{"no body", with("{id}.{timestamp}.", "X-Ts", "X-Id"), "SignedContent", "must end with {body}"},
		{"body not last", with("{body}.{id}.", "", "X-Id"), "SignedContent", "must end with {body}"},
		{"body twice", with("{body}.{body}", "", ""), "SignedContent", "twice"},
		{"id glued to the body", with("{id}{body}", "", "X-Id"), "SignedContent", "followed by a separator"},
		{"id glued to the timestamp", with("{id}{timestamp}.{body}", "X-Ts", "X-Id"), "SignedContent", "followed by a separator"},
		{"digit after the timestamp", with("{timestamp}0{body}", "X-Ts", ""), "SignedContent", "digit"},
		{"unknown token", with("{nonce}.{body}", "", ""), "SignedContent", "unknown token"},
		{"stray brace", with("}{body}", "", ""), "SignedContent", "brace"},
		{"open brace", with("{body", "", ""), "SignedContent", "brace"},
	}
	for _, c := range cases {
		_, err := webhook.NewHMAC(b.inbox, webhook.HMACConfig{HMACVerifier: c.v}, nop)
		var ce *dedupe.ConfigError
		if !errors.Is(err, dedupe.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(ce.Reason, c.says) {
			t.Errorf("%s: %v, want a *ConfigError on %s saying %q", c.name, err, c.field, c.says)
		}
	}
	// The control: the layouts of real senders are accepted.
	for _, v := range []webhook.HMACVerifier{
		with("", "", ""), with("", "X-Ts", ""), with("{id}.{timestamp}.{body}", "X-Ts", "X-Id"),
		with("v0:{timestamp}:{body}", "X-Ts", ""), with("{id}\n{body}", "", "X-Id"), with("{body}", "", ""),
	} {
		if _, err := webhook.NewHMAC(b.inbox, webhook.HMACConfig{HMACVerifier: v}, nop); err != nil {
			t.Errorf("layout %q: %v", v.SignedContent, err)
		}
	}
}

// A signed id that contains its separator could be read in two ways
// ("a.b" + "." + body and "a" + "." + "b.body"); it is refused, as is a
// delivery without the id header.
func TestHMACSignedIDRefusals(t *testing.T) {
	t.Parallel()
	body := []byte(`{"kind":"x"}`)
	for name, c := range map[string]struct {
		h    http.Header
		want error
	}{
		"id with the separator": {acmeDelivery("evt.1", body), webhook.ErrMalformedSignature},
		"no id header": {func() http.Header {
			h := acmeDelivery("evt_1", body)
			h.Del("X-Acme-Id")
			return h
		}(), webhook.ErrMissingSignature},
	} {
		_, err := acme.Verify(c.h, body, now)
		var se *webhook.SignatureError
		if !errors.Is(err, c.want) || !errors.As(err, &se) || se.Header != "X-Acme-Id" {
			t.Errorf("%s: %v, want a *SignatureError on X-Acme-Id matching %v", name, err, c.want)
		}
	}
}
