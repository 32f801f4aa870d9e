package test

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// pgProxy is a TCP proxy in front of the test's PostgreSQL server: a real
// database outage on demand. Down kills every connection through it and
// refuses new ones (it accepts and closes them at once, counting them, so a
// test can pace itself by the runner's attempts to reconnect); Up lets them
// through again.
type pgProxy struct {
	ln      net.Listener
	target  string
	refused atomic.Int64

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newPGProxy(t *testing.T, target string) *pgProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Down()
		p.wg.Wait()
	})
	return p
}

func (p *pgProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(c) })
	}
}

func (p *pgProxy) pipe(c net.Conn) {
	defer p.forget(c)
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		_ = s.Close()
		return
	}
	p.conns[s] = struct{}{}
	p.mu.Unlock()
	defer p.forget(s)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(s, c)
		_ = s.Close()
	})
	_, _ = io.Copy(c, s)
	_ = c.Close()
	wg.Wait()
}

func (p *pgProxy) forget(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Down starts the outage: live connections die, new ones are refused.
func (p *pgProxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Up ends the outage.
func (p *pgProxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// inboxBehind returns an inbox on the test's schema whose connections go
// through a new proxy, with obs as its Observer (nil for none), and the
// proxy.
func (b *bundle) inboxBehind(t *testing.T, obs dedupe.Observer) (*dedupe.Inbox, *pgProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := newPGProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(n), nil
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	inbox, err := dedupe.New(pool, dedupe.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return inbox, p
}
