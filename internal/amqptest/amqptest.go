// Package amqptest connects tests to the RabbitMQ broker of the machine
// (AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/), gives each test
// queues of its own that it deletes afterwards, and puts a TCP proxy in
// front of the broker to cut connections on demand.
package amqptest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// LocalURL is the broker's URL when AMQP_URL is not set.
const LocalURL = "amqp://guest:guest@127.0.0.1:5672/"

// URL returns the broker's URL: AMQP_URL, else LocalURL.
func URL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return LocalURL
}

// Dial connects to the broker, or fails the test with how to provide one:
// tests never pass by skipping.
func Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := DialURL(URL())
	if err != nil {
		t.Fatalf("amqptest: RabbitMQ does not answer at %s: %v\n"+
			"Start it (rabbitmq-server -detached; .ci/services does) or set AMQP_URL to a broker's amqp:// URL.", Redact(URL()), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// DialURL connects to url with a short dial timeout.
func DialURL(url string) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
}

// Redact hides the password of url.
func Redact(url string) string {
	if u, err := amqp.ParseURI(url); err == nil {
		u.Password = "xxx"
		return u.String()
	}
	return url
}

// Name returns a name unique to this test run, for queues and exchanges:
// "dedupe-test-<test name>-<random>".
func Name(t testing.TB, what string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	if len(n) > 80 {
		n = n[:80]
	}
	return "dedupe-test-" + n + "-" + what + "-" + hex.EncodeToString(b[:])
}

// Queue declares a durable queue named name with args on conn and deletes
// it when the test ends.
func Queue(t testing.TB, conn *amqp.Connection, name string, args amqp.Table) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("amqptest: declare queue %s: %v", name, err)
	}
	t.Cleanup(func() { Delete(name, "") })
}

// Exchange declares a durable exchange of kind on conn and deletes it when
// the test ends.
func Exchange(t testing.TB, conn *amqp.Connection, name, kind string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.ExchangeDeclare(name, kind, true, false, false, false, nil); err != nil {
		t.Fatalf("amqptest: declare exchange %s: %v", name, err)
	}
	t.Cleanup(func() { Delete("", name) })
}

// Delete deletes a queue or an exchange ("" for none) on a connection of its
// own, ignoring errors.
func Delete(queue, exchange string) {
	conn, err := DialURL(URL())
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	if queue != "" {
		_, _ = ch.QueueDelete(queue, false, false, false)
	}
	if exchange != "" {
		_ = ch.ExchangeDelete(exchange, false, false)
	}
}

// Count returns how many messages queue holds ready (not delivered, or
// requeued).
func Count(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("amqptest: inspect queue %s: %v", queue, err)
	}
	return q.Messages
}

// Drain takes every ready message of queue (auto-ack) and returns them.
func Drain(t testing.TB, conn *amqp.Connection, queue string) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("amqptest: get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// Errorf is fmt.Errorf, for callers that want amqptest's prefix.
func Errorf(format string, args ...any) error { return fmt.Errorf("amqptest: "+format, args...) }

// amqpURI returns host:port of an AMQP URL.
func amqpURI(url string) (string, error) {
	u, err := amqp.ParseURI(url)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s:%d", u.Host, u.Port), nil
}
