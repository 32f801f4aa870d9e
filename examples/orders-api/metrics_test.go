package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestMetricsEndpoint: GET /metrics serves, in Prometheus's format, the
// idempotency layer's claims by outcome: as many claimed as orders created
// and as many duplicates as replays answered, concurrent retries included.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	h := start(t)
	acme := map[string]string{"X-Tenant-ID": "acme", "Idempotency-Key": "order-m"}
	const n = 6
	answers := make([]answer, n)
	dbtest.Together(n, func(i int) { answers[i] = h.do(t, "POST", "/orders", acme, cart) })
	replayed, inFlight := 0, 0
	for _, a := range answers {
		switch {
		case a.status == 201 && a.header.Get("Idempotent-Replayed") == "true":
			replayed++
		case a.status == 409:
			inFlight++
		case a.status != 201:
			t.Fatalf("POST: %d %s", a.status, a.raw)
		}
	}
	if a := h.do(t, "POST", "/orders", acme, cart); a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v", a.status, a.header)
	}
	replayed++

	m := h.do(t, "GET", "/metrics", nil, "")
	if m.status != 200 {
		t.Fatalf("GET /metrics: %d %s", m.status, m.raw)
	}
	count := func(outcome string) int {
		re := regexp.MustCompile(`(?m)^dedupe_claims_total\{[^}]*dedupe_outcome="` + outcome + `"[^}]*\} (\d+)$`)
		sum := 0
		for _, g := range re.FindAllStringSubmatch(m.raw, -1) {
			v, _ := strconv.Atoi(g[1])
			sum += v
		}
		return sum
	}
	if got, orders := count("claimed"), h.orders(t, "acme"); got != orders || orders != 1 {
		t.Errorf("claimed = %d, orders created = %d, want 1:\n%s", got, orders, m.raw)
	}
	if got := count("duplicate"); got != replayed {
		t.Errorf("duplicate = %d, replays answered = %d:\n%s", got, replayed, m.raw)
	}
	if got := count("in_flight"); got != inFlight {
		t.Errorf("in_flight = %d, 409s answered = %d", got, inFlight)
	}
	if !regexp.MustCompile(`(?m)^dedupe_handle_duration_seconds_bucket\{`).MatchString(m.raw) {
		t.Errorf("no handling duration histogram:\n%s", m.raw)
	}
}
