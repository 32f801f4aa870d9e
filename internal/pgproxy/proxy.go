// Package pgproxy is a PostgreSQL-protocol proxy that injects the faults a
// real network produces and a test cannot otherwise reach: the reply to a
// COMMIT that never arrives (the transaction committed, the client cannot
// know), and a connection cut in the middle of a statement.
//
// It understands just enough of the protocol to see each frontend message:
// the startup packet (it answers an SSL or GSS encryption request with 'N',
// so clients fall back to plain text), then typed messages. A Policy decides,
// for every COMMIT and every other statement, whether to forward it, to cut
// the connection before it reaches the server, or (for COMMIT) to forward it,
// wait for the server's answer and cut the connection without passing the
// answer on, or to pass the answer on and then end the connection with a
// FATAL error, as a backend terminated right after it answered.
package pgproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
)

// Kind is what a frontend message does.
type Kind int

// Kinds of frontend messages a Policy is asked about.
const (
	// Commit is a COMMIT (or END) that runs: sent as a simple query, or
	// the Execute of a portal bound to it (pipelined with other
	// statements).
	Commit Kind = iota + 1
	// Statement is any other simple query or Execute, or an
	// extended-protocol Parse (of a COMMIT too: preparing it commits
	// nothing).
	Statement
)

// Action is a Policy's decision.
type Action int

// Actions.
const (
	// Forward passes the message on.
	Forward Action = iota
	// Cut closes both sides before the message reaches the server.
	Cut
	// DropReply forwards the message (and what the client sends after it),
	// waits until the server answered it (its ReadyForQuery) and closes both
	// sides without passing any of the answer on: for a COMMIT, or a
	// statement outside a transaction block, the server applied it and the
	// client cannot know.
	DropReply
	// FatalAfterReply forwards the message, passes the server's answer on
	// up to its ReadyForQuery, sends a FATAL ErrorResponse (57P01, what a
	// backend terminated by pg_terminate_backend or a fast shutdown
	// sends) in its place and closes both sides: the client hears that its
	// COMMIT completed and then a server error, the order in which a
	// backend terminated between the two sends them.
	FatalAfterReply
)

// Event describes one frontend message for the Policy.
type Event struct {
	Kind Kind
	// Query is the SQL text: of the simple query, of the Parse, or (for an
	// Execute) of the statement the executed portal was bound to.
	Query string
	// Runs is true when the message runs the statement (a simple query or
	// an Execute), false for a Parse, which only prepares it.
	Runs bool
	Conn int64 // the proxied connection's number, from 1
}

// Policy decides what happens to a message. It is called from the
// connection's goroutine and must be safe for concurrent use.
type Policy func(Event) Action

// Once returns a policy that applies action to the first message matching
// match, on any connection, and forwards everything else.
func Once(action Action, match func(Event) bool) Policy {
	var done atomic.Bool
	return func(ev Event) Action {
		if match(ev) && done.CompareAndSwap(false, true) {
			return action
		}
		return Forward
	}
}

// IsCommit matches a COMMIT that runs (Once's match for a COMMIT fault).
func IsCommit(ev Event) bool { return ev.Kind == Commit }

// Stats counts what the proxy did.
type Stats struct {
	Conns         int64 // client connections accepted
	Commits       int64 // COMMITs seen
	DroppedReplys int64 // COMMIT replies dropped after the server answered
	Cuts          int64 // connections cut before a message was forwarded
	Fatals        int64 // connections ended with a FATAL error after the server's answer
}

// Of returns how often the proxy took action a (Cut, DropReply or
// FatalAfterReply); 0 for Forward.
func (s Stats) Of(a Action) int64 {
	switch a {
	case Cut:
		return s.Cuts
	case DropReply:
		return s.DroppedReplys
	case FatalAfterReply:
		return s.Fatals
	}
	return 0
}

// Proxy forwards connections from its address to a PostgreSQL server.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	policy Policy
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
	n      atomic.Int64
	stats  struct{ conns, commits, dropped, cuts, fatals atomic.Int64 }
}

// Start listens on a free loopback port and forwards every connection to
// target (host:port). A nil policy forwards everything.
func Start(target string, policy Policy) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, policy: policy, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns dsn (a postgres:// URL) with its host and port replaced by the
// proxy's.
func (p *Proxy) URL(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return "", fmt.Errorf("pgproxy: %q is not a postgres:// URL", dsn)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// SetPolicy replaces the policy for the messages that follow.
func (p *Proxy) SetPolicy(policy Policy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.policy = policy
}

// Stats returns what the proxy did so far.
func (p *Proxy) Stats() Stats {
	return Stats{Conns: p.stats.conns.Load(), Commits: p.stats.commits.Load(),
		DroppedReplys: p.stats.dropped.Load(), Cuts: p.stats.cuts.Load(), Fatals: p.stats.fatals.Load()}
}

// Close stops accepting, cuts every open connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.closed.Store(true)
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) decide(ev Event) Action {
	p.mu.Lock()
	policy := p.policy
	p.mu.Unlock()
	if policy == nil {
		return Forward
	}
	return policy(ev)
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(client)
		}()
	}
}

// Protocol constants.
const (
	sslRequest  = 80877103
	gssRequest  = 80877104
	maxMsgBytes = 1 << 30
)

// session is one proxied connection.
type session struct {
	p      *Proxy
	id     int64
	client net.Conn
	server net.Conn
	// dropping is set once a message was forwarded whose reply is dropped;
	// fataling once one was whose ReadyForQuery becomes a FATAL error.
	dropping atomic.Bool
	fataling atomic.Bool
	once     sync.Once
	// The statements (by prepared name) and portals (by name) seen, so
	// that an Execute can be told which SQL it runs.
	stmts   map[string]string
	portals map[string]string
}

func (s *session) close() {
	s.once.Do(func() {
		_ = s.client.Close()
		if s.server != nil {
			_ = s.server.Close()
		}
	})
}

func (p *Proxy) serve(client net.Conn) {
	if !p.track(client) {
		_ = client.Close()
		return
	}
	defer p.untrack(client)
	p.stats.conns.Add(1)
	s := &session{p: p, id: p.n.Add(1), client: client, stmts: map[string]string{}, portals: map[string]string{}}
	defer s.close()
	cr := bufio.NewReader(client)

	// The startup phase: untyped packets, possibly an encryption request
	// first, which is refused so that the client goes on in plain text.
	var startup []byte
	for {
		pkt, err := readStartup(cr)
		if err != nil {
			return
		}
		code := binary.BigEndian.Uint32(pkt[4:8])
		if code == sslRequest || code == gssRequest {
			if _, err := client.Write([]byte{'N'}); err != nil {
				return
			}
			continue
		}
		startup = pkt
		break
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	s.server = server
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	if _, err := server.Write(startup); err != nil {
		return
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.pipeServer()
	}()
	s.pipeClient(cr)
	s.close()
	<-done
}

// pipeClient forwards frontend messages, asking the policy about each
// statement.
func (s *session) pipeClient(cr *bufio.Reader) {
	for {
		typ, msg, err := readTyped(cr)
		if err != nil {
			return
		}
		ev, ask := s.classify(typ, msg)
		action := Forward
		if ask && !s.dropping.Load() && !s.fataling.Load() {
			ev.Conn = s.id
			if ev.Kind == Commit {
				s.p.stats.commits.Add(1)
			}
			action = s.p.decide(ev)
		}
		switch action {
		case Cut:
			s.p.stats.cuts.Add(1)
			return
		case DropReply:
			s.dropping.Store(true) // pipeServer cuts at the next ReadyForQuery
		case FatalAfterReply:
			s.fataling.Store(true) // pipeServer ends with FATAL at the next ReadyForQuery
		}
		if _, err := s.server.Write(msg); err != nil {
			return
		}
	}
}

// pipeServer forwards backend messages until a dropped COMMIT's answer is
// complete, or one that ends with a FATAL error is answered.
func (s *session) pipeServer() {
	sr := bufio.NewReader(s.server)
	for {
		typ, msg, err := readTyped(sr)
		if err != nil {
			s.close()
			return
		}
		if s.dropping.Load() {
			if typ == 'Z' {
				// The server answered; the client never hears it.
				s.p.stats.dropped.Add(1)
				s.close()
				return
			}
			continue
		}
		if typ == 'Z' && s.fataling.Load() {
			s.p.stats.fatals.Add(1)
			_, _ = s.client.Write(fatalTerminated)
			s.close()
			return
		}
		if _, err := s.client.Write(msg); err != nil {
			s.close()
			return
		}
	}
}

// fatalTerminated is the ErrorResponse a backend terminated by
// pg_terminate_backend sends before it exits.
var fatalTerminated = errorResponse("FATAL", "57P01", "terminating connection due to administrator command")

// errorResponse encodes an ErrorResponse message.
func errorResponse(severity, code, message string) []byte {
	var body []byte
	for _, f := range []struct {
		typ byte
		val string
	}{{'S', severity}, {'V', severity}, {'C', code}, {'M', message}} {
		body = append(append(append(body, f.typ), f.val...), 0)
	}
	body = append(body, 0)
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(4+len(body)))
	return append(msg, body...)
}

// commitRE matches a COMMIT, alone or behind the RELEASE of a savepoint in
// the same simple query (a Consumer's checked COMMIT: RELEASE SAVEPOINT
// dedupe_claim; COMMIT).
var commitRE = regexp.MustCompile(`(?is)^\s*(release\s+(savepoint\s+)?\w+\s*;\s*)?(commit|end)(\s+(work|transaction))?\s*;?\s*$`)

// classify returns the event of a frontend message and whether the policy is
// asked about it, tracking prepared statements and portals on the way.
func (s *session) classify(typ byte, msg []byte) (Event, bool) {
	body := msg[5:]
	switch typ {
	case 'Q':
		return event(cString(body), true), true
	case 'P': // Parse: statement name, query, ...
		name := cString(body)
		q := cString(body[min(len(name)+1, len(body)):])
		s.stmts[name] = q
		return event(q, false), true
	case 'B': // Bind: portal name, statement name, ...
		portal := cString(body)
		stmt := cString(body[min(len(portal)+1, len(body)):])
		s.portals[portal] = s.stmts[stmt]
	case 'E': // Execute: portal name, max rows
		return event(s.portals[cString(body)], true), true
	}
	return Event{}, false
}

func event(q string, runs bool) Event {
	kind := Statement
	if runs && commitRE.MatchString(q) {
		kind = Commit
	}
	return Event{Kind: kind, Query: q, Runs: runs}
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// readStartup reads one untyped startup-phase packet, length included.
func readStartup(r *bufio.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 8 || n > maxMsgBytes {
		return nil, errors.New("pgproxy: bad startup packet length")
	}
	pkt := make([]byte, n)
	copy(pkt, hdr[:])
	if _, err := io.ReadFull(r, pkt[4:]); err != nil {
		return nil, err
	}
	return pkt, nil
}

// readTyped reads one typed message, type and length included.
func readTyped(r *bufio.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > maxMsgBytes {
		return 0, nil, errors.New("pgproxy: bad message length")
	}
	msg := make([]byte, 1+n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[5:]); err != nil {
		return 0, nil, err
	}
	return hdr[0], msg, nil
}

// Host returns the host:port of a postgres:// URL, for Start.
func Host(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return "", fmt.Errorf("pgproxy: %q is not a postgres:// URL", dsn)
	}
	host := u.Host
	if !strings.Contains(host, ":") {
		host += ":5432"
	}
	return host, nil
}
