package dedupeamqp_test

import (
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
)

func TestDefaultKeyIsTheMessageID(t *testing.T) {
	if k, err := dedupeamqp.DefaultKey(amqp.Delivery{MessageId: "m-1"}); err != nil || k != "m-1" {
		t.Fatalf("DefaultKey = %q, %v; want m-1", k, err)
	}
	if k, err := dedupeamqp.DefaultKey(amqp.Delivery{}); err == nil {
		t.Fatalf("DefaultKey without message_id = %q, nil; want an error", k)
	}
}

func TestHeaderKeyReadsStringsAndIntegers(t *testing.T) {
	key := dedupeamqp.HeaderKey("Order-Id")
	for _, c := range []struct {
		v    any
		want string
	}{
		{"o-1", "o-1"}, {[]byte("o-2"), "o-2"}, {int32(42), "42"}, {int64(-7), "-7"}, {uint16(9), "9"},
	} {
		got, err := key(amqp.Delivery{Headers: amqp.Table{"Order-Id": c.v}})
		if err != nil || got != c.want {
			t.Errorf("HeaderKey(%T %v) = %q, %v; want %q", c.v, c.v, got, err, c.want)
		}
	}
	for _, h := range []amqp.Table{nil, {"Order-Id": ""}, {"Order-Id": 1.5}, {"Order-Id": true}, {"Other": "x"}} {
		if got, err := key(amqp.Delivery{Headers: h}); err == nil {
			t.Errorf("HeaderKey(%v) = %q, nil; want an error", h, got)
		}
	}
}

func TestRefusedKeyStableDistinctAndBounded(t *testing.T) {
	d := amqp.Delivery{MessageId: "m-1", Body: []byte("body")}
	a, b := dedupeamqp.RefusedKey("orders", "", d), dedupeamqp.RefusedKey("orders", "", d)
	if a != b || !strings.HasPrefix(a, dedupeamqp.RefusedKeyPrefix+"orders/") {
		t.Fatalf("RefusedKey = %q then %q; want one stable key under the prefix and queue", a, b)
	}
	other := d
	other.Body = []byte("other body")
	if dedupeamqp.RefusedKey("orders", "", other) == a {
		t.Fatal("two different messages share a refused key")
	}
	if dedupeamqp.RefusedKey("orders", "k", d) == a {
		t.Fatal("a conflicting key and a keyless message share a refused key")
	}
	long := dedupeamqp.RefusedKey(strings.Repeat("q", 300), "", d)
	if len(long) > dedupe.MaxKeyLen || !strings.HasPrefix(long, dedupeamqp.RefusedKeyPrefix+"sha256-") {
		t.Fatalf("RefusedKey of a long queue = %q (%d bytes); want at most %d, the queue hashed", long, len(long), dedupe.MaxKeyLen)
	}
}

func TestTableHeadersCarrier(t *testing.T) {
	h := dedupeamqp.TableHeaders(amqp.Table{"traceparent": "00-x", "b": []byte("y"), "n": int32(1)})
	h.Set("tracestate", "k=v")
	if h.Get("traceparent") != "00-x" || h.Get("b") != "y" || h.Get("n") != "" || h.Get("tracestate") != "k=v" {
		t.Fatalf("headers = %v", h)
	}
	if got := strings.Join(h.Keys(), ","); got != "b,n,traceparent,tracestate" {
		t.Fatalf("Keys = %s", got)
	}
	dedupeamqp.TableHeaders(nil).Set("a", "b") // no panic
}

func TestKeyErrorMatches(t *testing.T) {
	cause := errors.New("cause")
	err := error(&dedupeamqp.KeyError{Queue: "q", Err: cause})
	if !errors.Is(err, dedupeamqp.ErrNoKey) || !errors.Is(err, cause) || !strings.Contains(err.Error(), `"q"`) {
		t.Fatalf("KeyError %v does not match ErrNoKey and its cause", err)
	}
	perr := error(&dedupeamqp.PublishError{Exchange: "", RoutingKey: "q", ReplyCode: 312, ReplyText: "NO_ROUTE", Err: dedupeamqp.ErrUnroutable})
	if !errors.Is(perr, dedupeamqp.ErrUnroutable) || !strings.Contains(perr.Error(), "312 NO_ROUTE") {
		t.Fatalf("PublishError %v", perr)
	}
}
