package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestMetricsEndpoint: the running receiver serves GET /metrics in
// Prometheus's format, counting each event's claims by outcome: one claimed
// per recorded event, one duplicate per re-sent delivery.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	env := map[string]string{"DATABASE_URL": db.URL, "ADDR": "127.0.0.1:0", "STRIPE_WEBHOOK_SECRET": stripeSecret}
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
	defer func() {
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	const events, copies = 3, 4
	for i := range events {
		d := stripeEvent("evt_m"+strconv.Itoa(i), "invoice.paid")
		dbtest.Together(copies, func(int) { send(t, base, d) })
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, body)
	}
	count := func(outcome string) int {
		re := regexp.MustCompile(`(?m)^dedupe_claims_total\{[^}]*dedupe_outcome="` + outcome + `"[^}]*\} (\d+)$`)
		sum := 0
		for _, g := range re.FindAllStringSubmatch(string(body), -1) {
			v, _ := strconv.Atoi(g[1])
			sum += v
		}
		return sum
	}
	recorded := db.Count(t, "SELECT count(*) FROM webhook_events")
	if got := count("claimed"); got != recorded || recorded != events {
		t.Errorf("claimed = %d, events recorded = %d, want %d:\n%s", got, recorded, events, body)
	}
	if got := count("duplicate"); got != events*(copies-1) {
		t.Errorf("duplicate = %d, want %d:\n%s", got, events*(copies-1), body)
	}
}
