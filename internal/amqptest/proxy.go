package amqptest

import (
	"bufio"
	"encoding/binary"
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
// unacknowledged deliveries). Hold leaves out the clients' basic.ack frames
// (their acks never reach the broker) until Cut.
type Proxy struct {
	ln       net.Listener
	target   string
	cuts     atomic.Int64
	heldAcks atomic.Int64

	mu    sync.Mutex
	held  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy starts a proxy to the broker of URL() and stops it when the test
// ends.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	p, err := StartProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// StartProxy starts a proxy to the broker of URL(), for programs (the soak);
// the caller closes it.
func StartProxy() (*Proxy, error) {
	u, err := parse(URL())
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: u, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
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

// Hold leaves out the basic.ack frames clients send until the next Cut.
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
		p.wg.Go(func() { defer done(); p.copy(s, c) })
		p.wg.Go(func() { defer done(); _, _ = io.Copy(c, s) })
	}
}

// copy passes the client's bytes on to the broker frame by frame, leaving
// out basic.ack frames while acks are held.
func (p *Proxy) copy(dst io.Writer, src io.Reader) {
	r := bufio.NewReaderSize(src, 64<<10)
	header := make([]byte, 8) // "AMQP" 0 0 9 1
	if _, err := io.ReadFull(r, header); err != nil {
		return
	}
	if _, err := dst.Write(header); err != nil {
		return
	}
	for {
		// A frame: type (1), channel (2), size (4), payload, frame-end.
		head := make([]byte, 7)
		if _, err := io.ReadFull(r, head); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(head[3:])
		frame := make([]byte, 7+int(size)+1)
		copy(frame, head)
		if _, err := io.ReadFull(r, frame[7:]); err != nil {
			return
		}
		p.mu.Lock()
		held := p.held
		p.mu.Unlock()
		const methodFrame, basicClass, ackMethod = 1, 60, 80
		if held && head[0] == methodFrame && size >= 4 &&
			binary.BigEndian.Uint16(frame[7:]) == basicClass && binary.BigEndian.Uint16(frame[9:]) == ackMethod {
			p.heldAcks.Add(1)
			continue
		}
		if _, err := dst.Write(frame); err != nil {
			return
		}
	}
}

// HeldAcks returns how many basic.ack frames the proxy left out.
func (p *Proxy) HeldAcks() int64 { return p.heldAcks.Load() }
