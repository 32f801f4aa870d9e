package dedupeotel_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/baggage"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
	"github.com/exactlyonce/dedupe/outbox"
)

// The sender's trace context and baggage, as an attacker sends them with a
// validly signed delivery: none of these headers is signed.
const (
	senderTrace     = "4bf92f3577b34da6a3ce929d0e0e4736"
	senderSpan      = "00f067aa0ba902b7"
	senderParent    = "00-" + senderTrace + "-" + senderSpan + "-01" // sampled
	senderBaggage   = "tenant=attacker,is_admin=true,user.id=0"
	publicSecret    = "whsec_public"
	publicEventBody = `{"id":"evt_public","type":"order.paid"}`
)

// publicEnv is a database with an inbox and an outbox reporting to an
// Observer whose provider samples by sampler, its spans recorded.
type publicEnv struct {
	db      *dbtest.DB
	spans   *tracetest.SpanRecorder
	inbox   *dedupe.Inbox
	outbox  *outbox.Outbox
	mu      sync.Mutex
	baggage []string // the handler context's baggage, per handling
}

func newPublicEnv(t *testing.T, sampler sdktrace.Sampler) *publicEnv {
	t.Helper()
	e := &publicEnv{db: dbtest.New(t), spans: tracetest.NewSpanRecorder()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(e.spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := dedupeotel.New(dedupeotel.Config{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.Close() })
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, e.db.Pool, dedupe.MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	if e.inbox, err = dedupe.New(e.db.Pool, dedupe.Config{Observer: obs, Logger: dbtest.Logger(t)}); err != nil {
		t.Fatal(err)
	}
	if e.outbox, err = outbox.New(e.db.Pool, outbox.Config{Observer: obs, Logger: dbtest.Logger(t)}); err != nil {
		t.Fatal(err)
	}
	return e
}

// effect is the handlers' work: it notes the handler context's baggage and
// enqueues an outbox message in the transaction.
func (e *publicEnv) effect(ctx context.Context, tx pgx.Tx) error {
	e.mu.Lock()
	e.baggage = append(e.baggage, baggage.FromContext(ctx).String())
	e.mu.Unlock()
	_, err := e.outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders.paid", Key: "o-1", Payload: []byte(`{}`)})
	return err
}

// published runs the relay once and returns the headers of what it
// published.
func (e *publicEnv) published(t *testing.T) []map[string][]string {
	t.Helper()
	b := &broker{}
	relay, err := outbox.NewRelay(e.outbox, outbox.PublishFunc(b.Publish), outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Cycle(context.Background()); err != nil {
		t.Fatal(err)
	}
	var out []map[string][]string
	for _, m := range b.msgs {
		out = append(out, m.Headers)
	}
	return out
}

// stripeDelivery is a validly signed Stripe delivery carrying the sender's
// trace context and baggage.
func stripeDelivery(t *testing.T, url string) *http.Request {
	t.Helper()
	ts := time.Now().Unix()
	mac := hmac.New(sha256.New, []byte(publicSecret))
	fmt.Fprintf(mac, "%d.%s", ts, publicEventBody)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(publicEventBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Stripe-Signature", fmt.Sprintf("t=%d,v1=%s", ts, hex.EncodeToString(mac.Sum(nil))))
	req.Header.Set("Traceparent", senderParent)
	req.Header.Set("Baggage", senderBaggage)
	return req
}

// publicEndpoint delivers one request with the sender's headers to a public
// endpoint built on e, trusting its callers or not.
type publicEndpoint func(t *testing.T, e *publicEnv, trust bool)

var publicEndpoints = map[string]publicEndpoint{
	"webhook": func(t *testing.T, e *publicEnv, trust bool) {
		h, err := webhook.NewStripe(e.inbox, webhook.StripeConfig{Secrets: []string{publicSecret},
			Config: webhook.Config{TrustCallers: trust, Logger: dbtest.Logger(t)}},
			func(ctx context.Context, tx pgx.Tx, _ webhook.Event) error { return e.effect(ctx, tx) })
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		defer srv.Close()
		resp, err := http.DefaultClient.Do(stripeDelivery(t, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("signed delivery answered %d", resp.StatusCode)
		}
	},
	"httpidem transactional": func(t *testing.T, e *publicEnv, trust bool) { idemRequest(t, e, trust, httpidem.Transactional) },
	"httpidem leased":        func(t *testing.T, e *publicEnv, trust bool) { idemRequest(t, e, trust, httpidem.Leased) },
}

func idemRequest(t *testing.T, e *publicEnv, trust bool, mode httpidem.Mode) {
	t.Helper()
	mw, err := httpidem.New(e.db.Pool, httpidem.Config{Mode: mode, TrustCallers: trust, Logger: dbtest.Logger(t),
		Inbox: dedupe.Config{Observer: e.inbox.Config().Observer}})
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := httpidem.Tx(r.Context())
		if err == nil {
			err = e.effect(r.Context(), tx)
		}
		if err != nil {
			httpidem.WriteError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader([]byte(`{}`)))
	req.Header.Set("Idempotency-Key", "key-public")
	req.Header.Set("Traceparent", senderParent)
	req.Header.Set("Baggage", senderBaggage)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusCreated {
		t.Fatalf("request answered %d %s", w.Code, w.Body)
	}
}

// TestPublicEndpointStartsItsOwnTrace is the attack of issue 32: a request
// to a public endpoint (a validly signed Stripe delivery, an
// Idempotency-Key request) carries a sampled traceparent and baggage that
// its sender chose, through a provider that samples nothing by itself
// (ParentBased(NeverSample)). The handling must not join the sender's
// trace, nor be recorded because the sender's flag says so, and the
// sender's baggage must reach neither the handler's context nor the outbox
// message it enqueues (which the relay forwards to other services). Under a
// provider that samples, the process span is a root of its own trace that
// links the sender's span.
func TestPublicEndpointStartsItsOwnTrace(t *testing.T) {
	t.Parallel()
	for name, deliver := range publicEndpoints {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newPublicEnv(t, sdktrace.ParentBased(sdktrace.NeverSample()))
			deliver(t, e, false)
			for _, s := range e.spans.Ended() {
				t.Errorf("span %q recorded (trace %s): the sender's sampled flag chose to record it", s.Name(), s.SpanContext().TraceID())
			}
			wantNoSenderContext(t, e)

			// Sampled by the provider: a root linked to the sender.
			e = newPublicEnv(t, sdktrace.ParentBased(sdktrace.AlwaysSample()))
			deliver(t, e, false)
			process := processSpan(t, e)
			if process.Parent().IsValid() || process.SpanContext().TraceID().String() == senderTrace {
				t.Fatalf("process span: parent %v, trace %s; want the root of a trace of its own", process.Parent(), process.SpanContext().TraceID())
			}
			if !linksSender(process) {
				t.Fatalf("process span links %v, want the sender's span context", process.Links())
			}
			for _, s := range e.spans.Ended() {
				if s.SpanContext().TraceID().String() == senderTrace {
					t.Fatalf("span %q is in the sender's trace", s.Name())
				}
			}
			wantNoSenderContext(t, e)
		})
	}
}

// TestPublicEndpointTrustingItsCallers: with TrustCallers the endpoint
// takes the caller's trace context as the parent and adopts its baggage, as
// a broker consumer does for producers you run.
func TestPublicEndpointTrustingItsCallers(t *testing.T) {
	t.Parallel()
	for name, deliver := range publicEndpoints {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newPublicEnv(t, sdktrace.ParentBased(sdktrace.NeverSample()))
			deliver(t, e, true)
			process := processSpan(t, e)
			if process.Parent().TraceID().String() != senderTrace || process.Parent().SpanID().String() != senderSpan {
				t.Fatalf("process span's parent = %v, want the caller's span", process.Parent())
			}
			if name == "httpidem leased" {
				// The core's Begin reports a leased handling without
				// handing its span's context to the handler: the handler
				// runs in the request's context, which holds neither.
				return
			}
			if len(e.baggage) != 1 || !strings.Contains(e.baggage[0], "tenant=attacker") {
				t.Fatalf("handler baggage %q, want the caller's", e.baggage)
			}
			msgs := e.published(t)
			if len(msgs) != 1 || !strings.Contains(first(msgs[0], "traceparent"), senderTrace) ||
				!strings.Contains(first(msgs[0], "baggage"), "tenant=attacker") {
				t.Fatalf("published headers %v, want the caller's trace and baggage", msgs)
			}
		})
	}
}

// wantNoSenderContext fails if the sender's baggage reached the handler or
// the sender's trace or baggage the published outbox message.
func wantNoSenderContext(t *testing.T, e *publicEnv) {
	t.Helper()
	if len(e.baggage) != 1 || e.baggage[0] != "" {
		t.Fatalf("handler context baggage %q, want none (handled once)", e.baggage)
	}
	msgs := e.published(t)
	if len(msgs) != 1 {
		t.Fatalf("published %d messages, want 1", len(msgs))
	}
	for k, v := range msgs[0] {
		if strings.Contains(strings.Join(v, ","), senderTrace) || strings.Contains(strings.Join(v, ","), "attacker") {
			t.Fatalf("outbox message header %s = %q carries the sender's context", k, v)
		}
	}
}

func processSpan(t *testing.T, e *publicEnv) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if strings.HasPrefix(s.Name(), "process ") {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d process spans, want 1", len(found))
	}
	return found[0]
}

func linksSender(s sdktrace.ReadOnlySpan) bool {
	for _, l := range s.Links() {
		if l.SpanContext.TraceID().String() == senderTrace && l.SpanContext.SpanID().String() == senderSpan {
			return true
		}
	}
	return false
}

func first(h map[string][]string, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}
