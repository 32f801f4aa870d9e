package direct

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/dedupe/internal/pgerr"
)

// Params are the values of one claim that the round encodes: the test clock
// (nil: the database's), the key, the state a new row gets, the claim's
// token, and the inbox's lease and retention.
type Params struct {
	Now              *time.Time
	Scope, ID, State string
	Fingerprint      []byte
	Token            int64
	Lease, Retention time.Duration
}

// Row is what the claim returned for a row it inserted: its state,
// attempts, lease end and lease left.
type Row struct {
	State       string
	Attempts    int
	LockedUntil *time.Time
	Left        *time.Duration
}

// Peek is what the peek read of a key the claim found taken.
type Peek struct {
	State       string
	Attempts    int
	Token       int64
	LockedUntil *time.Time
	Fingerprint []byte
	ReadAt      time.Time
}

// Result is what one round learnt: the claim inserted its key (Row), or
// found it taken and, when the peek was read (Peeked), its row (Peek).
type Result struct {
	Inserted bool
	Row      Row
	Peeked   bool
	Peek     Peek
}

// Allowed reports whether a connection of cfg sends what pgx's batch
// would send when it gets the direct round: pgx's default statement mode,
// whose cache prepares named statements, and no tracer, which must see
// every statement.
func Allowed(cfg *pgx.ConnConfig) bool {
	return cfg.Tracer == nil && cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement &&
		MaxInboxes(cfg.StatementCacheCapacity) > 0
}

// ErrNoDirect is a connection on which the direct round is not sent; the
// claim goes through pgx's batch.
var ErrNoDirect = errors.New("dedupe: the direct claim round is not for this connection")

// Conn is what the direct round keeps with a connection, in its
// pgconn's CustomData: whether the connection's own configuration allows
// the round, and the inboxes whose statements are prepared on it, least
// recently used first, at most max of them. pgx bounds its own statement
// cache (StatementCacheCapacity) and deallocates what it evicts; so does
// the round, so that an application with an inbox per tenant does not
// grow every backend without bound.
type Conn struct {
	ok       bool
	max      int
	prepared []*Stmts
	// stale is set when a round over database/sql found a statement gone
	// or changed, inside a transaction it cannot retry in: the next round
	// on the connection prepares every statement anew.
	stale bool
}

// connKey is the CustomData key of a connection's Conn.
const connKey = "github.com/exactlyonce/dedupe.directConn"

// MaxInboxes bounds the inbox tables whose statements a connection
// keeps prepared, so that the round's statements fit in the connection's
// statement cache capacity: those all inboxes share (shared) and two
// per inbox table, at most 16 tables. 0 (a capacity too small for one
// table's) leaves the claims to pgx's batch.
func MaxInboxes(capacity int) int { return min(max((capacity-shared)/2, 0), 16) }

// shared counts the statements of the round that all inboxes may
// share on a connection: the lock timeout, the savepoint and the BEGINs a
// consumer can send (the default and one per isolation level: a consumer's
// transaction options set only the isolation level).
const shared = 2 + 5

// StateOf returns conn's Conn, made on the connection's first round
// from its own configuration, which a pool's BeforeConnect may have changed.
func StateOf(conn *pgx.Conn) *Conn {
	data := conn.PgConn().CustomData()
	if st, ok := data[connKey].(*Conn); ok {
		return st
	}
	cfg := conn.Config()
	st := &Conn{ok: Allowed(cfg), max: MaxInboxes(cfg.StatementCacheCapacity)}
	data[connKey] = st
	return st
}

// Use makes s the most recently used inbox of the connection, first
// deallocating the statements of the least recently used one when s is new
// there and the connection holds max already.
func (st *Conn) Use(ctx context.Context, conn *pgx.Conn, s *Stmts) error {
	if st.stale {
		for _, p := range st.prepared {
			if err := p.Deallocate(ctx, conn); err != nil {
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

// Stmt is a statement of the direct round, prepared on each
// connection under a name of its own, with the types the round encodes and
// decodes.
type Stmt struct {
	name, sql      string
	params, fields []uint32
}

// Stmts are an inbox's statements of the direct round.
type Stmts struct {
	claim, peek, lockTimeout, savepoint Stmt
	// Off is set once a connection prepared them with other types than the
	// round's (the inbox table was altered): from then on the inbox's
	// claims go through pgx's batch.
	Off atomic.Bool
}

// NewStmt names the statement sql after its hash.
func NewStmt(sql string, params, fields []uint32) Stmt {
	sum := sha256.Sum256([]byte(sql))
	return Stmt{name: "dedupe_" + hex.EncodeToString(sum[:8]), sql: sql, params: params, fields: fields}
}

// NewStmts returns an inbox's statements of the round: its claim and peek
// (SQL with the inbox table filled in), the consumer's settings statement
// and the savepoint.
func NewStmts(claimSQL, peekSQL, settingsSQL, savepointSQL string) *Stmts {
	stmt := NewStmt
	return &Stmts{
		claim: stmt(claimSQL,
			[]uint32{OIDTimestamptz, OIDText, OIDText, OIDText, OIDBytea, OIDInt8, OIDInterval, OIDInterval},
			[]uint32{OIDText, OIDInt4, OIDTimestamptz, OIDInterval}),
		peek: stmt(peekSQL,
			[]uint32{OIDTimestamptz, OIDText, OIDText, OIDInt8},
			[]uint32{OIDText, OIDInt4, OIDInt8, OIDTimestamptz, OIDBytea, OIDTimestamptz}),
		// The consumer's settings (txopts.Settings), its lock timeout among them.
		lockTimeout: stmt(settingsSQL, []uint32{OIDText}, []uint32{OIDText}),
		savepoint:   stmt(savepointSQL, nil, nil),
	}
}

// Prepare returns s prepared on conn: a map lookup once it was prepared
// there. It returns ErrTypes when the statement's types are not the
// ones the round encodes (a table altered by hand).
func (s *Stmt) Prepare(ctx context.Context, conn *pgx.Conn) (*pgconn.StatementDescription, error) {
	sd, err := conn.Prepare(ctx, s.name, s.sql)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(sd.ParamOIDs, s.params) || len(sd.Fields) != len(s.fields) {
		return nil, ErrTypes
	}
	for n, f := range sd.Fields {
		if f.DataTypeOID != s.fields[n] {
			return nil, ErrTypes
		}
	}
	return sd, nil
}

// ErrTypes is a prepared statement whose types the direct round
// does not know: the round goes through pgx instead.
var ErrTypes = errors.New("dedupe: statement types differ from the direct round's")

// Begin is how a consumer's transaction begins in the direct round:
// the BEGIN that pgx sends for its options, and the batch that makes pgx
// adopt the transaction begun by it. The batch is only read, never
// changed, so all of a consumer's rounds share it.
type Begin struct {
	Stmt  Stmt
	adopt *pgx.Batch
}

func NewBegin(opts pgx.TxOptions) *Begin {
	b := &pgx.Batch{}
	b.BeginTx(opts)
	sql := b.QueuedQueries[0].SQL
	b.QueuedQueries = nil
	return &Begin{Stmt: NewStmt(sql, nil, nil), adopt: b}
}

// Args holds one round's encoded parameters: every value in one
// buffer, the claim's eight parameters (the peek's are their first four,
// its token the claim's) and the lock timeout's.
type Args struct {
	buf    []byte
	claim  [8][]byte
	peek   [4][]byte
	lockTO [1][]byte
}

// Encode fills a with the parameters of r's claim (sqlClaimInsert's) and
// peek (sqlPeek's), and of lockTimeout when set.
func (a *Args) Encode(r *Params, lockTimeout string) {
	now := r.Now
	n := 48 + len(r.Scope) + len(r.ID) + len(r.State) + len(r.Fingerprint) + len(lockTimeout)
	buf := make([]byte, 0, n)
	// Each value is appended, then sliced out with its capacity capped.
	mark := 0
	take := func() []byte {
		v := buf[mark:len(buf):len(buf)]
		mark = len(buf)
		return v
	}
	if now != nil {
		buf = AppendTimestamptz(buf, *now)
		a.claim[0] = take()
	}
	buf = append(buf, r.Scope...)
	a.claim[1] = take()
	buf = append(buf, r.ID...)
	a.claim[2] = take()
	buf = append(buf, r.State...)
	a.claim[3] = take()
	if r.Fingerprint != nil {
		buf = append(buf, r.Fingerprint...)
		a.claim[4] = take()
	}
	buf = AppendInt8(buf, r.Token)
	a.claim[5] = take()
	buf = AppendInterval(buf, r.Lease)
	a.claim[6] = take()
	buf = AppendInterval(buf, r.Retention)
	a.claim[7] = take()
	if lockTimeout != "" {
		buf = append(buf, lockTimeout...)
		a.lockTO[0] = take()
	}
	a.peek = [4][]byte{a.claim[0], a.claim[1], a.claim[2], a.claim[5]}
	a.buf = buf
}

// Send sends one round on conn and reads its results: BEGIN (unless
// begin is nil: the transaction is open already), the lock timeout when args
// has one, the claim, the peek when peek is set, and the savepoint. Every
// statement is prepared on the connection, so that the server parses none
// of them again.
func Send(ctx context.Context, conn *pgx.Conn, st *Conn, s *Stmts, begin *Stmt, args *Args, peek bool, round *Result) error {
	if err := st.Use(ctx, conn, s); err != nil {
		return err
	}
	claim, err := s.claim.Prepare(ctx, conn)
	if err != nil {
		return err
	}
	var peekSD *pgconn.StatementDescription
	if peek {
		if peekSD, err = s.peek.Prepare(ctx, conn); err != nil {
			return err
		}
	}
	sp, err := s.savepoint.Prepare(ctx, conn)
	if err != nil {
		return err
	}
	var b pgconn.Batch
	first := 0 // the result of the claim
	if begin != nil {
		bg, err := begin.Prepare(ctx, conn)
		if err != nil {
			return err
		}
		b.ExecStatement(bg, nil, nil, nil)
		first++
	}
	if args.lockTO[0] != nil {
		lt, err := s.lockTimeout.Prepare(ctx, conn)
		if err != nil {
			return err
		}
		b.ExecStatement(lt, args.lockTO[:], BinaryFormat, BinaryFormat)
		first++
	}
	b.ExecStatement(claim, args.claim[:], BinaryFormat, BinaryFormat)
	if peek {
		b.ExecStatement(peekSD, args.peek[:], BinaryFormat, BinaryFormat)
	}
	b.ExecStatement(sp, nil, nil, nil)

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
				derr = round.decodePeek(rr.Values())
			}
		}
		_, _ = rr.Close() // its error is the batch's, below
	}
	if err := mrr.Close(); err != nil {
		return err
	}
	if derr != nil {
		return derr
	}
	if conn.PgConn().TxStatus() != 'T' {
		return fmt.Errorf("dedupe: transaction status %q after the claim", conn.PgConn().TxStatus())
	}
	return nil
}

// PeekAfter reads, in the transaction a round without the peek began on
// conn, the key that round's claim found taken: the round's own encoded
// parameters, the statement prepared as the round's are.
func PeekAfter(ctx context.Context, conn *pgx.Conn, s *Stmts, args *Args, round *Result) error {
	sd, err := s.peek.Prepare(ctx, conn)
	if err != nil {
		return err
	}
	rr := conn.PgConn().ExecPrepared(ctx, sd.Name, args.peek[:], BinaryFormat, BinaryFormat)
	var derr error
	for rr.NextRow() {
		if derr == nil {
			derr = round.decodePeek(rr.Values())
		}
	}
	if _, err := rr.Close(); err != nil {
		return err
	}
	return derr
}

// decodeClaim decodes the row sqlClaimInsert returned (claimReturning):
// the key was new and this round inserted it.
func (round *Result) decodeClaim(v [][]byte) error {
	if len(v) != 4 || v[0] == nil || v[1] == nil {
		return ErrWireValue
	}
	row := &round.Row
	row.State = WireState(v[0])
	attempts, err := WireInt4(v[1])
	if err != nil {
		return err
	}
	row.Attempts = attempts
	if v[2] != nil {
		t, err := WireTimestamptz(v[2])
		if err != nil {
			return err
		}
		row.LockedUntil = &t
	}
	if v[3] != nil {
		left, err := WireInterval(v[3])
		if err != nil {
			return err
		}
		row.Left = &left
	}
	round.Inserted = true
	return nil
}

// decodePeek decodes the row sqlPeek returned: the key existed.
func (round *Result) decodePeek(v [][]byte) error {
	if len(v) != 6 || v[0] == nil || v[1] == nil || v[2] == nil || v[5] == nil {
		return ErrWireValue
	}
	rec := &round.Peek
	rec.State = WireState(v[0])
	var err error
	if rec.Attempts, err = WireInt4(v[1]); err != nil {
		return err
	}
	if rec.Token, err = WireInt8(v[2]); err != nil {
		return err
	}
	if v[3] != nil {
		t, err := WireTimestamptz(v[3])
		if err != nil {
			return err
		}
		rec.LockedUntil = &t
	}
	if v[4] != nil {
		rec.Fingerprint = slices.Clone(v[4])
	}
	if rec.ReadAt, err = WireTimestamptz(v[5]); err != nil {
		return err
	}
	round.Peeked = true
	return nil
}

// Adopt returns the transaction conn is in as pgx's own pgx.Tx (see
// Begin).
func Adopt(ctx context.Context, conn *pgx.Conn, begin *Begin) (pgx.Tx, error) {
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

// RollbackConn ends whatever transaction a failed round left open on conn,
// so that the connection can go back to its pool.
func RollbackConn(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
}

// StaleStatement reports an error of a statement prepared earlier on the
// connection that preparing it again mends.
func StaleStatement(err error) bool {
	code, ok := pgerr.SQLState(err)
	// 0A000: cached plan must not change result type.
	return ok && (code == pgerr.InvalidSQLStatementName || code == pgerr.FeatureNotSupported)
}

// Deallocate forgets s's statements, and the others given, on conn, so
// that they are prepared anew.
func (s *Stmts) Deallocate(ctx context.Context, conn *pgx.Conn, others ...*Stmt) error {
	for _, st := range append([]*Stmt{&s.claim, &s.peek, &s.lockTimeout, &s.savepoint}, others...) {
		if err := conn.Deallocate(ctx, st.name); err != nil {
			return err
		}
	}
	return nil
}

// OK reports whether the connection's own configuration allows the round.
func (st *Conn) OK() bool { return st.ok }

// MarkStale makes the next round on the connection prepare every statement
// anew: a round over database/sql found one gone or changed, inside a
// transaction it cannot retry in.
func (st *Conn) MarkStale() { st.stale = true }
