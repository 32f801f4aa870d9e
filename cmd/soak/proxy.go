package main

import (
	"fmt"

	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// proxied reports whether the consumers talk to PostgreSQL through the fault
// proxy: when any of its faults has a rate.
func proxied(o *options) bool {
	return o.rates[faultCommitLost] > 0 || o.rates[faultReplyLost] > 0 || o.rates[faultCut] > 0
}

// startProxy starts a PostgreSQL-protocol proxy in front of the database for
// e's consumers (in-process and worker subprocesses; the soak's own admin
// connections, which pace faults and audit, go direct) and points e.dsn at
// it. Per statement it decides at random, at the -drop-commit-rate,
// -drop-reply-rate and -cut-rate, to drop the reply to a COMMIT or to
// another statement after the server applied it, or to cut the connection
// before the statement reaches the server. The rates are per statement, so
// the faults are paced by the work done, never by the clock.
func startProxy(e *env) (*pgproxy.Proxy, error) {
	host, err := pgproxy.Host(e.soak.opts.dsn)
	if err != nil {
		return nil, err
	}
	f := e.faults
	p, err := pgproxy.Start(host, func(ev pgproxy.Event) pgproxy.Action {
		if !ev.Runs {
			return pgproxy.Forward // a Parse: the Execute that follows decides
		}
		switch {
		case f.hit(faultCut):
			return pgproxy.Cut
		case ev.Kind == pgproxy.Commit && f.hit(faultCommitLost):
			return pgproxy.DropReply
		case ev.Kind != pgproxy.Commit && f.hit(faultReplyLost):
			return pgproxy.DropReply
		}
		return pgproxy.Forward
	})
	if err != nil {
		return nil, fmt.Errorf("start the fault proxy: %w", err)
	}
	if e.dsn, err = p.URL(e.soak.opts.dsn); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}
