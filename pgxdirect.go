package dedupe

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The direct claim round. On a pgx pool or connection in pgx's default
// statement mode (QueryExecModeCacheStatement) and without a tracer, a
// Consumer sends BEGIN, its lock timeout, the claim, the peek (see
// peekahead.go) and the savepoint as one pgconn batch: one write, one Sync,
// one round trip, the same statements pgx's pipelined batch would send. The
// claim and the peek are prepared once per connection under names of their
// own, and their values are encoded and decoded here in PostgreSQL's binary
// format (pgwire.go). What this saves is pgx's pipeline bookkeeping (a list
// element and result state per queued statement) and its per-value type
// plans: about 40 allocations per message.
//
// The handler still receives pgx's own transaction: pgx adopts the
// transaction begun here through a batch whose only queued statement, the
// BEGIN that Batch.BeginTx queues, was taken out again (directBegin). Sent
// on a connection, a batch without statements sends nothing, and the
// transaction that Batch.BeginTx promised is the one the connection is in.
//
// Anywhere else (a tracer, which must see every statement; another
// statement mode, such as one chosen for PgBouncer; a type that is neither
// pool nor connection; database/sql other than over pgx's stdlib, whose
// round sqldirect.go sends through sendDirect) the round goes through pgx's
// batch.

// pgxDirect sends direct claim rounds over a pool or a connection.
type pgxDirect struct {
	pool *pgxpool.Pool
	conn *pgx.Conn
	// off is set once a connection's own configuration refused the round
	// (a BeforeConnect hook that sets a tracer or another statement mode):
	// the pool's connections are made alike, so its claims go through
	// pgx's batch from then on.
	off atomic.Bool
}

// newPgxDirect returns the direct round's sender for db, or nil where the
// round must go through pgx.
func newPgxDirect(db pgxDB) *pgxDirect {
	var (
		cfg *pgx.ConnConfig
		d   pgxDirect
	)
	switch db := db.(type) {
	case *pgxpool.Pool:
		cfg, d.pool = db.Config().ConnConfig, db
	case *pgx.Conn:
		cfg, d.conn = db.Config(), db
	default:
		return nil
	}
	if !directAllowed(cfg) {
		return nil
	}
	return &d
}

// directAllowed reports whether a connection of cfg sends what pgx's batch
// would send when it gets the direct round: pgx's default statement mode,
// whose cache prepares named statements, and no tracer, which must see
// every statement.
func directAllowed(cfg *pgx.ConnConfig) bool {
	return cfg.Tracer == nil && cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement &&
		maxDirectInboxes(cfg.StatementCacheCapacity) > 0
}

// errNoDirect is a connection on which the direct round is not sent; the
// claim goes through pgx's batch.
var errNoDirect = errors.New("dedupe: the direct claim round is not for this connection")

// directConn is what the direct round keeps with a connection, in its
// pgconn's CustomData: whether the connection's own configuration allows
// the round, and the inboxes whose statements are prepared on it, least
// recently used first, at most max of them. pgx bounds its own statement
// cache (StatementCacheCapacity) and deallocates what it evicts; so does
// the round, so that an application with an inbox per tenant does not
// grow every backend without bound.
type directConn struct {
	ok       bool
	max      int
	prepared []*directStmts
	// stale is set when a round over database/sql found a statement gone
	// or changed, inside a transaction it cannot retry in: the next round
	// on the connection prepares every statement anew.
	stale bool
}

// directConnKey is the CustomData key of a connection's directConn.
const directConnKey = "github.com/exactlyonce/dedupe.directConn"

// maxDirectInboxes bounds the inbox tables whose statements a connection
// keeps prepared, so that the round's statements fit in the connection's
// statement cache capacity: those all inboxes share (directShared) and two
// per inbox table, at most 16 tables. 0 (a capacity too small for one
// table's) leaves the claims to pgx's batch.
func maxDirectInboxes(capacity int) int { return min(max((capacity-directShared)/2, 0), 16) }

// directShared counts the statements of the round that all inboxes may
// share on a connection: the lock timeout, the savepoint and the BEGINs a
// consumer can send (the default and one per isolation level: a consumer's
// transaction options set only the isolation level).
const directShared = 2 + 5

// stateOf returns conn's directConn, made on the connection's first round
// from its own configuration, which a pool's BeforeConnect may have changed.
func stateOf(conn *pgx.Conn) *directConn {
	data := conn.PgConn().CustomData()
	if st, ok := data[directConnKey].(*directConn); ok {
		return st
	}
	cfg := conn.Config()
	st := &directConn{ok: directAllowed(cfg), max: maxDirectInboxes(cfg.StatementCacheCapacity)}
	data[directConnKey] = st
	return st
}

// use makes s the most recently used inbox of the connection, first
// deallocating the statements of the least recently used one when s is new
// there and the connection holds max already.
func (st *directConn) use(ctx context.Context, conn *pgx.Conn, s *directStmts) error {
	if st.stale {
		for _, p := range st.prepared {
			if err := p.deallocate(ctx, conn); err != nil {
				return err
			}
		}
		st.prepared, st.stale = st.prepared[:0], false
	}
	for n, p := range st.prepared {
		// Inboxes of one table share their statements' names (hashes of
		// the SQL), and so the prepared statements: one entry per table,
		// told by its claim's name.
		if p.claim.name == s.claim.name {
			copy(st.prepared[n:], st.prepared[n+1:])
			st.prepared[len(st.prepared)-1] = s
			return nil
		}
	}
	if len(st.prepared) >= st.max {
		old := st.prepared[0]
		for _, name := range []string{old.claim.name, old.peek.name} {
			if err := conn.Deallocate(ctx, name); err != nil {
				return err
			}
		}
		st.prepared = append(st.prepared[:0], st.prepared[1:]...)
	}
	st.prepared = append(st.prepared, s)
	return nil
}

// directStmt is a statement of the direct round, prepared on each
// connection under a name of its own, with the types the round encodes and
// decodes.
type directStmt struct {
	name, sql      string
	params, fields []uint32
}

// directStmts are an inbox's statements of the direct round.
type directStmts struct {
	claim, peek, lockTimeout, savepoint directStmt
	// off is set once a connection prepared them with other types than the
	// round's (the inbox table was altered): from then on the inbox's
	// claims go through pgx's batch.
	off atomic.Bool
}

// newDirectStmt names the statement sql after its hash.
func newDirectStmt(sql string, params, fields []uint32) directStmt {
	sum := sha256.Sum256([]byte(sql))
	return directStmt{name: "dedupe_" + hex.EncodeToString(sum[:8]), sql: sql, params: params, fields: fields}
}

func newDirectStmts(q *queries) *directStmts {
	stmt := newDirectStmt
	return &directStmts{
		claim: stmt(q.claimInsert,
			[]uint32{oidTimestamptz, oidText, oidText, oidText, oidBytea, oidInt8, oidInterval, oidInterval},
			[]uint32{oidText, oidInt4, oidTimestamptz, oidInterval}),
		peek: stmt(q.peek,
			[]uint32{oidTimestamptz, oidText, oidText, oidInt8},
			[]uint32{oidText, oidInt4, oidInt8, oidTimestamptz, oidBytea, oidTimestamptz}),
		// The consumer's settings (txSettings), its lock timeout among them.
		lockTimeout: stmt(sqlTxSettings, []uint32{oidText}, []uint32{oidText}),
		savepoint:   stmt(sqlSavepoint, nil, nil),
	}
}

// prepare returns s prepared on conn: a map lookup once it was prepared
// there. It returns errDirectTypes when the statement's types are not the
// ones the round encodes (a table altered by hand).
func (s *directStmt) prepare(ctx context.Context, conn *pgx.Conn) (*pgconn.StatementDescription, error) {
	sd, err := conn.Prepare(ctx, s.name, s.sql)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(sd.ParamOIDs, s.params) || len(sd.Fields) != len(s.fields) {
		return nil, errDirectTypes
	}
	for n, f := range sd.Fields {
		if f.DataTypeOID != s.fields[n] {
			return nil, errDirectTypes
		}
	}
	return sd, nil
}

// errDirectTypes is a prepared statement whose types the direct round
// does not know: the round goes through pgx instead.
var errDirectTypes = errors.New("dedupe: statement types differ from the direct round's")

// directBegin is how a consumer's transaction begins in the direct round:
// the BEGIN that pgx sends for its options, and the batch that makes pgx
// adopt the transaction begun by it. The batch is only read, never
// changed, so all of a consumer's rounds share it.
type directBegin struct {
	stmt  directStmt
	adopt *pgx.Batch
}

func newDirectBegin(opts pgx.TxOptions) *directBegin {
	b := &pgx.Batch{}
	b.BeginTx(opts)
	sql := b.QueuedQueries[0].SQL
	b.QueuedQueries = nil
	return &directBegin{stmt: newDirectStmt(sql, nil, nil), adopt: b}
}

// directOff sends the inbox's claims through pgx's batch from now on: a
// connection prepared the direct round's statements with other types than
// the round's (the inbox table was altered).
func (i *Inbox) directOff(ctx context.Context) {
	if i.direct.off.CompareAndSwap(false, true) {
		i.cfg.Logger.WarnContext(ctx, "dedupe: the inbox table's column types are not the migration's; claims go through pgx's batch from now on",
			"table", i.table)
	}
}

// pooledTx is a transaction on a connection acquired from a pool, which it
// releases when it ends, as pgxpool's own transaction does.
type pooledTx struct {
	pgx.Tx
	conn *pgxpool.Conn
}

func (t *pooledTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.release()
	return err
}

func (t *pooledTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.release()
	return err
}

func (t *pooledTx) release() {
	if t.conn != nil {
		t.conn.Release()
		t.conn = nil
	}
}

// directArgs holds one round's encoded parameters: every value in one
// buffer, the claim's eight parameters (the peek's are their first four,
// its token the claim's) and the lock timeout's.
type directArgs struct {
	buf    []byte
	claim  [8][]byte
	peek   [4][]byte
	lockTO [1][]byte
}

// encode fills a with the parameters of r's claim (sqlClaimInsert's) and
// peek (sqlPeek's), and of lockTimeout when set.
func (a *directArgs) encode(i *Inbox, r *claimReq, lockTimeout string) {
	now := i.cfg.now()
	n := 48 + len(r.key.Scope) + len(r.key.ID) + len(r.state) + len(r.key.Fingerprint) + len(lockTimeout)
	buf := make([]byte, 0, n)
	// Each value is appended, then sliced out with its capacity capped.
	mark := 0
	take := func() []byte {
		v := buf[mark:len(buf):len(buf)]
		mark = len(buf)
		return v
	}
	if now != nil {
		buf = appendTimestamptz(buf, *now)
		a.claim[0] = take()
	}
	buf = append(buf, r.key.Scope...)
	a.claim[1] = take()
	buf = append(buf, r.key.ID...)
	a.claim[2] = take()
	buf = append(buf, r.state...)
	a.claim[3] = take()
	if r.key.Fingerprint != nil {
		buf = append(buf, r.key.Fingerprint...)
		a.claim[4] = take()
	}
	buf = appendInt8(buf, r.token)
	a.claim[5] = take()
	buf = appendInterval(buf, i.cfg.Lease)
	a.claim[6] = take()
	buf = appendInterval(buf, i.cfg.Retention)
	a.claim[7] = take()
	if lockTimeout != "" {
		buf = append(buf, lockTimeout...)
		a.lockTO[0] = take()
	}
	a.peek = [4][]byte{a.claim[0], a.claim[1], a.claim[2], a.claim[5]}
	a.buf = buf
}

// claimDirect begins a transaction on a connection of d and claims r in
// it: BEGIN (begin.sql), the lock timeout when set, the claim, the peek
// (when the inbox's recent claims met duplicates: peekahead.go) and the
// savepoint, in one round trip; a claim that found its key taken without
// the peek reads it in a second. It returns errNoDirect, having sent
// nothing, or errDirectTypes, having rolled back what it sent, when the
// round must go through pgx instead.
func (d *pgxDirect) claimDirect(ctx context.Context, i *Inbox, begin *directBegin, lockTimeout string, r *claimReq) (txConn, *claimRound, error) {
	// Encoded before a connection is acquired: it reads Config.Clock,
	// which may panic (a test's), and must not leave a connection behind.
	args := &directArgs{}
	args.encode(i, r, lockTimeout)
	conn, pc := d.conn, (*pgxpool.Conn)(nil)
	if d.pool != nil {
		var err error
		if pc, err = d.pool.Acquire(ctx); err != nil {
			return nil, nil, err
		}
		conn = pc.Conn()
	}
	release := func() {
		if pc != nil {
			pc.Release()
		}
	}
	st := stateOf(conn)
	if !st.ok {
		release()
		if d.off.CompareAndSwap(false, true) {
			i.cfg.Logger.DebugContext(ctx, "dedupe: the pool's connections are configured for pgx's batch (a tracer or another statement mode); claims go through it")
		}
		return nil, nil, errNoDirect
	}
	for try := 0; ; try++ {
		round, err := sendDirect(ctx, conn, st, i, &begin.stmt, args, r)
		if err == nil {
			tx, err := adoptTx(ctx, conn, begin)
			if err != nil {
				rollbackConn(ctx, conn)
				release()
				return nil, nil, err
			}
			if pc != nil {
				tx = &pooledTx{Tx: tx, conn: pc}
			}
			return (*pgxTx)(newGuard(tx)), round, nil
		}
		rollbackConn(ctx, conn)
		if try == 0 && staleStatement(err) && !conn.IsClosed() {
			// A statement prepared on this connection went away (DEALLOCATE
			// ALL) or its result type changed (ALTER TABLE): prepare anew.
			derr := i.direct.deallocate(ctx, conn, &begin.stmt)
			if derr == nil {
				continue
			}
			err = errors.Join(err, derr)
		}
		release()
		if errors.Is(err, errDirectTypes) {
			i.directOff(ctx)
		}
		return nil, nil, err
	}
}

// sendDirect claims r on conn in the direct round and learns the state of a
// key it finds taken: one round trip, and a second for the read of a taken
// key when the inbox's recent claims met no duplicate (peekahead.go). Both
// drivers' direct rounds claim through it, so that they send the same.
func sendDirect(ctx context.Context, conn *pgx.Conn, st *directConn, i *Inbox, begin *directStmt, args *directArgs, r *claimReq) (*claimRound, error) {
	n, ahead := i.ahead.next()
	round, err := sendRound(ctx, conn, st, i.direct, begin, args, r, ahead)
	if err != nil || round.inserted {
		return round, err
	}
	i.ahead.found(n)
	if !ahead {
		if err := peekDirect(ctx, conn, i.direct, args, r, round); err != nil {
			return nil, err
		}
	}
	return round, nil
}

// sendRound sends one round on conn and reads its results: BEGIN (unless
// begin is nil: the transaction is open already), the lock timeout when args
// has one, the claim, the peek when peek is set, and the savepoint. Every
// statement is prepared on the connection, so that the server parses none
// of them again.
func sendRound(ctx context.Context, conn *pgx.Conn, st *directConn, s *directStmts, begin *directStmt, args *directArgs, r *claimReq, peek bool) (*claimRound, error) {
	if err := st.use(ctx, conn, s); err != nil {
		return nil, err
	}
	claim, err := s.claim.prepare(ctx, conn)
	if err != nil {
		return nil, err
	}
	var peekSD *pgconn.StatementDescription
	if peek {
		if peekSD, err = s.peek.prepare(ctx, conn); err != nil {
			return nil, err
		}
	}
	sp, err := s.savepoint.prepare(ctx, conn)
	if err != nil {
		return nil, err
	}
	var b pgconn.Batch
	first := 0 // the result of the claim
	if begin != nil {
		bg, err := begin.prepare(ctx, conn)
		if err != nil {
			return nil, err
		}
		b.ExecStatement(bg, nil, nil, nil)
		first++
	}
	if args.lockTO[0] != nil {
		lt, err := s.lockTimeout.prepare(ctx, conn)
		if err != nil {
			return nil, err
		}
		b.ExecStatement(lt, args.lockTO[:], binaryFormat, binaryFormat)
		first++
	}
	b.ExecStatement(claim, args.claim[:], binaryFormat, binaryFormat)
	if peek {
		b.ExecStatement(peekSD, args.peek[:], binaryFormat, binaryFormat)
	}
	b.ExecStatement(sp, nil, nil, nil)

	round := &claimRound{}
	mrr := conn.PgConn().ExecBatch(ctx, &b)
	var derr error
	for n := 0; mrr.NextResult(); n++ {
		rr := mrr.ResultReader()
		for rr.NextRow() {
			if derr != nil {
				continue
			}
			switch n - first {
			case 0:
				derr = round.decodeClaim(rr.Values())
			case 1:
				derr = round.decodePeek(rr.Values(), r.key)
			}
		}
		_, _ = rr.Close() // its error is the batch's, below
	}
	if err := mrr.Close(); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	if conn.PgConn().TxStatus() != 'T' {
		return nil, fmt.Errorf("dedupe: transaction status %q after the claim", conn.PgConn().TxStatus())
	}
	return round, nil
}

// peekDirect reads, in the transaction a round without the peek began on
// conn, the key that round's claim found taken: the round's own encoded
// parameters, the statement prepared as the round's are.
func peekDirect(ctx context.Context, conn *pgx.Conn, s *directStmts, args *directArgs, r *claimReq, round *claimRound) error {
	sd, err := s.peek.prepare(ctx, conn)
	if err != nil {
		return err
	}
	rr := conn.PgConn().ExecPrepared(ctx, sd.Name, args.peek[:], binaryFormat, binaryFormat)
	var derr error
	for rr.NextRow() {
		if derr == nil {
			derr = round.decodePeek(rr.Values(), r.key)
		}
	}
	if _, err := rr.Close(); err != nil {
		return err
	}
	return derr
}

// decodeClaim decodes the row sqlClaimInsert returned (claimReturning):
// the key was new and this round inserted it.
func (round *claimRound) decodeClaim(v [][]byte) error {
	if len(v) != 4 || v[0] == nil || v[1] == nil {
		return errWireValue
	}
	row := &round.row
	row.state = wireState(v[0])
	attempts, err := wireInt4(v[1])
	if err != nil {
		return err
	}
	row.attempts = attempts
	if v[2] != nil {
		t, err := wireTimestamptz(v[2])
		if err != nil {
			return err
		}
		row.lockedUntil = &t
	}
	if v[3] != nil {
		left, err := wireInterval(v[3])
		if err != nil {
			return err
		}
		row.left = &left
	}
	round.inserted = true
	return nil
}

// decodePeek decodes the row sqlPeek returned: the key existed.
func (round *claimRound) decodePeek(v [][]byte, key Key) error {
	if len(v) != 6 || v[0] == nil || v[1] == nil || v[2] == nil || v[5] == nil {
		return errWireValue
	}
	rec := &Record{Key: Key{Scope: key.Scope, ID: key.ID}, State: State(wireState(v[0]))}
	var err error
	if rec.Attempts, err = wireInt4(v[1]); err != nil {
		return err
	}
	if rec.Token, err = wireInt8(v[2]); err != nil {
		return err
	}
	if v[3] != nil {
		t, err := wireTimestamptz(v[3])
		if err != nil {
			return err
		}
		rec.LockedUntil = &t
	}
	if v[4] != nil {
		rec.Key.Fingerprint = slices.Clone(v[4])
	}
	if rec.ReadAt, err = wireTimestamptz(v[5]); err != nil {
		return err
	}
	round.rec = rec
	return nil
}

// adoptTx returns the transaction conn is in as pgx's own pgx.Tx (see
// directBegin).
func adoptTx(ctx context.Context, conn *pgx.Conn, begin *directBegin) (pgx.Tx, error) {
	br := conn.SendBatch(ctx, begin.adopt)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, errors.New("dedupe: pgx did not adopt the transaction")
	}
	return tx, nil
}

// rollbackConn ends whatever transaction a failed round left open on conn,
// so that the connection can go back to its pool.
func rollbackConn(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
}

// staleStatement reports an error of a statement prepared earlier on the
// connection that preparing it again mends.
func staleStatement(err error) bool {
	code, ok := sqlState(err)
	return ok && (code == pgInvalidSQLStatementName || code == pgFeatureNotSupported)
}

// deallocate forgets s's statements, and the others given, on conn, so
// that they are prepared anew.
func (s *directStmts) deallocate(ctx context.Context, conn *pgx.Conn, others ...*directStmt) error {
	for _, st := range append([]*directStmt{&s.claim, &s.peek, &s.lockTimeout, &s.savepoint}, others...) {
		if err := conn.Deallocate(ctx, st.name); err != nil {
			return err
		}
	}
	return nil
}
