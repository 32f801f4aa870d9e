package dedupetest

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// Faulty is a pool whose connections pass through a PostgreSQL-protocol
// proxy that injects the faults of a real network, with an inbox over it.
type Faulty struct {
	// Pool connects through the proxy; Inbox is an inbox over it with the
	// Env's configuration.
	Pool  *pgxpool.Pool
	Inbox *dedupe.Inbox

	proxy   *pgproxy.Proxy
	dropped atomic.Int32 // COMMIT replies still to drop
	cut     atomic.Int32 // COMMITs still to cut
}

// Faulty returns a pool and an inbox through a fault-injecting proxy. It
// forwards everything until armed with LoseNextCommitReply or
// CutNextCommit.
func (e *Env) Faulty(t testing.TB) *Faulty {
	t.Helper()
	host, err := pgproxy.Host(e.URL)
	if err != nil {
		t.Fatalf("dedupetest: %v", err)
	}
	f := &Faulty{}
	p, err := pgproxy.Start(host, func(ev pgproxy.Event) pgproxy.Action {
		if ev.Kind != pgproxy.Commit {
			return pgproxy.Forward
		}
		if take(&f.dropped) {
			return pgproxy.DropReply
		}
		if take(&f.cut) {
			return pgproxy.Cut
		}
		return pgproxy.Forward
	})
	if err != nil {
		t.Fatalf("dedupetest: proxy: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	f.proxy = p
	u, err := p.URL(e.URL)
	if err != nil {
		t.Fatalf("dedupetest: %v", err)
	}
	f.Pool = newPool(t, u, 0)
	cfg := e.cfg
	if f.Inbox, err = dedupe.New(f.Pool, cfg); err != nil {
		t.Fatalf("dedupetest: inbox: %v", err)
	}
	return f
}

func take(n *atomic.Int32) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// LoseNextCommitReply makes the proxy forward the next COMMIT, wait until
// the server committed, and cut the connection without passing the reply
// on: the client cannot know that its transaction committed. A correct
// consumer learns it (dedupe resolves it on a fresh connection) and never
// reports it as a rollback.
func (f *Faulty) LoseNextCommitReply() { f.dropped.Add(1) }

// CutNextCommit makes the proxy cut the connection before the next COMMIT
// reaches the server: the transaction rolls back.
func (f *Faulty) CutNextCommit() { f.cut.Add(1) }

// CommitRepliesLost reports how many COMMIT replies the proxy dropped.
func (f *Faulty) CommitRepliesLost() int64 { return f.proxy.Stats().DroppedReplys }

// failCommitSQL installs, once, a deferred constraint trigger on the inbox
// that raises at COMMIT for the transaction that draws an armed number from
// a sequence: sequences do not roll back, so each armed failure fires once.
// A transaction draws one number, at its first inbox row (a batch writes
// several; a transaction-local setting marks the draw). {{s}} is the kit's
// schema, {{inbox}} the inbox table, both quoted and qualified.
const failCommitSQL = `
CREATE TABLE IF NOT EXISTS {{s}}.dedupetest_fail_commit (fail_at bigint NOT NULL);
CREATE SEQUENCE IF NOT EXISTS {{s}}.dedupetest_fail_commit_seq;
CREATE OR REPLACE FUNCTION {{s}}.dedupetest_fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('dedupetest.drawn', true) IS DISTINCT FROM 'yes' THEN
        PERFORM set_config('dedupetest.drawn', 'yes', true);
        IF nextval('{{s}}.dedupetest_fail_commit_seq') IN (SELECT fail_at FROM {{s}}.dedupetest_fail_commit) THEN
            RAISE EXCEPTION 'dedupetest: injected failure at COMMIT' USING ERRCODE = 'P0001';
        END IF;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS dedupetest_fail_commit ON {{inbox}};
CREATE CONSTRAINT TRIGGER dedupetest_fail_commit AFTER INSERT OR UPDATE ON {{inbox}}
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{s}}.dedupetest_fail_commit()`

// armFailSQL arms the first number no transaction has drawn and no earlier
// call armed: two calls arm two failures, for the next two transactions.
const armFailSQL = `
INSERT INTO {{s}}.dedupetest_fail_commit
SELECT GREATEST(
    (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {{s}}.dedupetest_fail_commit_seq),
    (SELECT COALESCE(max(fail_at), 0) FROM {{s}}.dedupetest_fail_commit)) + 1`

// FailNextCommit makes the next transaction that writes the inbox (a
// claim) fail at its COMMIT, after the handler ran: everything it wrote
// rolls back, as a deferred constraint, a serialization failure at commit or
// a disk full would. A correct consumer reports the attempt as failed and
// the redelivery runs the handler again, once. Each call arms one more
// failure: called twice, the next two such transactions fail. It works on
// an inbox in Config.Schema as on one in the Env's schema.
func (e *Env) FailNextCommit(t testing.TB) {
	t.Helper()
	s := pgx.Identifier{e.Schema}.Sanitize()
	r := strings.NewReplacer("{{s}}", s, "{{inbox}}", e.inboxTable())
	e.Exec(t, r.Replace(failCommitSQL))
	e.Exec(t, r.Replace(armFailSQL))
}

// inboxTable is the inbox's table, quoted and qualified when Config.Schema
// names its schema.
func (e *Env) inboxTable() string {
	table := e.cfg.Table
	if table == "" {
		table = dedupe.DefaultTable
	}
	if e.cfg.Schema != "" {
		return pgx.Identifier{e.cfg.Schema, table}.Sanitize()
	}
	return pgx.Identifier{table}.Sanitize()
}

// ExpireLeases ends every live lease of the inbox now, as if the holders'
// time had run out while their handlers still ran: the next Begin of each
// key takes it over, and the old holders' Complete is refused. It returns
// how many leases it ended.
func (e *Env) ExpireLeases(t testing.TB) int {
	t.Helper()
	ctx, cancel, _ := callContext(t)
	defer cancel()
	tag, err := e.Pool.Exec(ctx, `UPDATE `+e.inboxTable()+` SET locked_until = clock_timestamp() - interval '1 millisecond'
WHERE state = 'in_flight' AND locked_until > clock_timestamp()`)
	if err != nil {
		t.Fatalf("dedupetest: expire leases: %v", err)
	}
	return int(tag.RowsAffected())
}

// Poison marks key failed, as its attempts being used up would: deliveries
// of it report OutcomePoisoned until an operator releases it.
func (e *Env) Poison(t testing.TB, key dedupe.Key) {
	t.Helper()
	ctx, cancel, _ := callContext(t)
	defer cancel()
	c, err := e.Inbox.Begin(ctx, key)
	if err != nil || c.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("dedupetest: poison %s: begin = %v, %v", key, c, err)
	}
	if _, err := e.Inbox.Fail(ctx, c, dedupe.Permanent(errors.New("dedupetest: poisoned"))); err != nil {
		t.Fatalf("dedupetest: poison %s: %v", key, err)
	}
}
