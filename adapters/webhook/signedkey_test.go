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
