package test

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/dedupe"
	dedupewatermill "github.com/exactlyonce/dedupe/adapters/watermill"
	"github.com/exactlyonce/dedupe/internal/observetest"
)

// amqpURL is RabbitMQ's, from AMQP_URL or the machine's default.
func amqpURL(t *testing.T) string {
	u := os.Getenv("AMQP_URL")
	if u == "" {
		u = "amqp://guest:guest@127.0.0.1:5672/"
	}
	c, err := amqp091.Dial(u)
	if err != nil {
		t.Fatalf("RabbitMQ is not answering at %s (%v); these tests need it: set AMQP_URL, or start one with: rabbitmq-server -detached", u, err)
	}
	_ = c.Close()
	return u
}

// queueDepth is how many messages queue holds ready for delivery.
func queueDepth(t *testing.T, url, queue string) int {
	t.Helper()
	c, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// deleteQueue removes queue when the test ends.
func deleteQueue(t *testing.T, url, queue string) {
	t.Cleanup(func() {
		c, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
	})
}

// proxy forwards TCP connections to target until the test ends; cut
// closes the connections it carries, as when a process is killed.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
			p.wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
		}
	})
	t.Cleanup(func() { _ = ln.Close(); p.cut(); p.wg.Wait() })
	return p
}

func (p *proxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	n := len(p.conns)
	p.conns = nil
	return n
}

// Two routers consume one durable RabbitMQ queue (competing consumers)
// while every message is published twice under its UUID; the first
// router's connection is cut again and again mid-run (paced by progress),
// with messages in its handlers. Every message's effect happens once, and
// the queue ends empty.
func TestAMQPDuplicatesAndRouterKilled(t *testing.T) {
	url := amqpURL(t)
	obs := observetest.New()
	e := setup(t, obs)
	queue := fmt.Sprintf("dedupe-test-orders-%s", e.db.Schema)
	deleteQueue(t, url, queue)
	pub, err := amqp.NewPublisher(amqp.NewDurableQueueConfig(url), wmLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	host := url[len("amqp://guest:guest@") : len(url)-1]
	px := newProxy(t, host)
	victimCfg := amqp.NewDurableQueueConfig("amqp://guest:guest@" + px.ln.Addr().String() + "/")
	victimCfg.Connection.Reconnect = &amqp.ReconnectConfig{BackoffInitialInterval: 50 * time.Millisecond, BackoffRandomizationFactor: 0.5, BackoffMultiplier: 1.5, BackoffMaxInterval: 500 * time.Millisecond}
	victimCfg.Consume.Qos.PrefetchCount = 8
	victim, err := amqp.NewSubscriber(victimCfg, wmLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Close() })
	otherCfg := amqp.NewDurableQueueConfig(url)
	otherCfg.Consume.Qos.PrefetchCount = 8
	other, err := amqp.NewSubscriber(otherCfg, wmLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })

	slow := noPublish(func(msg *message.Message) error {
		time.Sleep(2 * time.Millisecond) // keep some in flight when the cut comes
		return insertEffect(msg)
	})
	stopVictim := router(t, newMiddleware(t, e, dedupewatermill.Config{}), victim, queue, slow, nil, "")
	stopOther := router(t, newMiddleware(t, e, dedupewatermill.Config{}), other, queue, slow, nil, "")

	const n = 300
	go func() {
		for i := range n {
			for range 2 {
				if err := pub.Publish(queue, message.NewMessage(fmt.Sprintf("order-%d", i), []byte("x"))); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	cuts := 0
	for next := 40; next < n; next += 40 {
		obs.Wait(t, 30*time.Second, fmt.Sprintf("%d effects", next), func() bool { return e.effects(t) >= next })
		if px.cut() > 0 {
			cuts++
		}
	}
	obs.Wait(t, 60*time.Second, "every message handled", func() bool {
		return e.effects(t) == n && obs.Handled(dedupe.OutcomeClaimed)+obs.Handled(dedupe.OutcomeDuplicate) >= 2*n
	})
	stopVictim()
	stopOther()
	if got := e.effects(t); got != n {
		t.Fatalf("effects = %d, want %d", got, n)
	}
	if got := e.db.Count(t, "SELECT count(DISTINCT msg_id) FROM effects"); got != n {
		t.Fatalf("distinct effects = %d, want %d", got, n)
	}
	if d := queueDepth(t, url, queue); d != 0 {
		t.Fatalf("queue holds %d messages after both routers stopped, want 0", d)
	}
	if cuts < 3 {
		t.Fatalf("cut the first router's connection %d times, want at least 3", cuts)
	}
}
