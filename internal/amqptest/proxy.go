package amqptest

import (
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy in front of the broker: Cut closes every connection
// through it at once, as a broker restart, a network failure or a killed
// client process would (the broker sees the client vanish and requeues its
// unacknowledged deliveries). Hold stops passing the client's bytes on (its
// acks never reach the broker) until Cut.
type Proxy struct {
	ln     net.Listener
	target string
	cuts   atomic.Int64

	mu    sync.Mutex
	held  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy starts a proxy to the broker of URL() and stops it when the test
// ends.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	u, err := parse(URL())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: u, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

func parse(url string) (string, error) {
	u, err := amqpURI(url)
	if err != nil {
		return "", err
	}
	return u, nil
}

// URL is the broker's URL through the proxy.
func (p *Proxy) URL() string {
	u := URL()
	host, _ := amqpURI(u)
	if !strings.Contains(u, host) {
		host = strings.TrimSuffix(host, ":5672")
	}
	return strings.Replace(u, host, p.ln.Addr().String(), 1)
}

// Cuts returns how many times Cut closed connections.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// Hold stops forwarding what clients send (their acks are held) until the
// next Cut.
func (p *Proxy) Hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// Cut closes every connection through the proxy; new ones are accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.held = false
	p.mu.Unlock()
	p.cuts.Add(1)
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.conns[s] = struct{}{}
		p.mu.Unlock()
		done := func() {
			_ = c.Close()
			_ = s.Close()
			p.mu.Lock()
			delete(p.conns, c)
			delete(p.conns, s)
			p.mu.Unlock()
		}
		p.wg.Go(func() { defer done(); p.copy(s, c, true) })
		p.wg.Go(func() { defer done(); _, _ = io.Copy(c, s) })
	}
}

// copy passes client bytes on to the broker, dropping them while held.
func (p *Proxy) copy(dst io.Writer, src io.Reader, client bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			held := client && p.held
			p.mu.Unlock()
			if !held {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
