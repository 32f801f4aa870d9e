package dedupe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/headerjson"
	"github.com/exactlyonce/dedupe/internal/pgbatch"
	"github.com/exactlyonce/dedupe/internal/pgerr"
)

// Claim claims key inside the caller's transaction tx, the transactional
// mode: the claim commits or rolls back with tx. The caller runs its effects
// only for OutcomeClaimed; for every other outcome it should roll back (or
// commit nothing of its own).
//
// A claim costs one round trip. Over pgx, the read of an existing key goes
// to the server with the claim while one of the inbox's recent claims found
// its key taken (internal/direct.Ahead), so a stream of duplicates costs one round
// trip each; after a run of new keys a new key sends no read, and a claim
// that finds its key taken reads it in a second round trip. Over
// database/sql the read always follows a claim that found its key taken.
// Either way the read sees the committed row in a fresh snapshot (READ
// COMMITTED), so the outcome is the same. A concurrent transaction holding
// the same new key makes Claim wait until it ends. On OutcomeDuplicate,
// Claim.Result holds the stored result.
//
// If tx's COMMIT fails without a reply, use Resolve to learn whether the
// claim (and so the caller's effects) committed.
func (i *Inbox) Claim(ctx context.Context, tx Querier, key Key) (*Claim, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if err := i.reentrant(ctx, key); err != nil {
		return nil, err
	}
	req := i.newClaimReq(key, StateComplete, i.cfg.maxAttemptsParam())
	b := &pgx.Batch{}
	// The token is new: a row holding it can only be this insert's own,
	// which the insert returns, so the read skips it (a new key reads and
	// returns no row). Run one by one (database/sql), the read is sent
	// only when the insert found the key taken.
	n, ahead := i.ahead.Next()
	read := readOthers
	if !ahead && i.drv.Pipelines() {
		read = readLater
	}
	round := i.queueClaim(b, req, read)
	sent := time.Now()
	if err := sendBatch(ctx, tx, b); err != nil {
		return nil, translate(err)
	}
	if !round.inserted {
		i.ahead.Found(n)
		if read == readLater {
			// Not this claim's row: the insert returned none.
			rec, err := i.lookup(ctx, tx, key)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return nil, err
			}
			round.rec = rec
		}
	}
	c, _, err := i.settle(ctx, tx, req, round, sent)
	return c, err
}

// claimReq is one claim: the key, the state it is claimed in (complete for
// transactional, in flight for leased), the attempt's fencing token and the
// attempt limit.
type claimReq struct {
	key         Key
	state       State
	token       int64
	maxAttempts int
}

func (i *Inbox) newClaimReq(key Key, state State, maxAttempts int) *claimReq {
	return &claimReq{key: key, state: state, token: newToken(), maxAttempts: maxAttempts}
}

// newToken returns a random, non-zero fencing token.
func newToken() int64 {
	for {
		if t := rand.Int64(); t != 0 {
			return t
		}
	}
}

// args are the parameters of sqlClaimInsert; sqlClaim adds maxAttempts.
// Their positions are claimArg*.
func (i *Inbox) claimArgs(r *claimReq) []any {
	return []any{i.cfg.now(), r.key.Scope, r.key.ID, stateArg(r.state), r.key.Fingerprint, r.token,
		i.leaseArg, i.retentionArg}
}

// Positions in claimArgs of the arguments sqlPeek shares with the claim.
const (
	claimArgNow   = 0
	claimArgScope = 1
	claimArgKey   = 2
	claimArgToken = 5
)

// The claim states as statement arguments, converted once.
var (
	argComplete any = string(StateComplete)
	argInFlight any = string(StateInFlight)
)

// stateArg is a claim state as a statement argument.
func stateArg(s State) any {
	switch s {
	case StateComplete:
		return argComplete
	case StateInFlight:
		return argInFlight
	}
	return string(s)
}

// claimRow is what a claim statement returns for a row it inserted or took.
type claimRow struct {
	state       string
	attempts    int
	lockedUntil *time.Time
	left        *time.Duration
}

func (c *claimRow) dest() []any { return []any{&c.state, &c.attempts, &c.lockedUntil, &c.left} }

// claimRound holds the results of a claim's insert and the read queued
// behind it.
type claimRound struct {
	inserted bool
	row      claimRow
	rec      *Record // the existing row, nil if none (or the insert's own)
	// later holds the claim's arguments for the peek a driver that does not
	// pipeline leaves to peekAfter.
	later []any
}

// readRound is a claim round with a full read of the key (readAll,
// readOthers): what it scanned is kept in the round's own allocation. The
// consumer's rounds (readPeek) need no such room.
type readRound struct {
	claimRound
	read recordDest
}

// claimRead is what queueClaim reads behind the insert.
type claimRead int

const (
	// readAll reads the whole row, whoever's it is: a retry of a claim
	// whose reply was lost (the same token) finds its own row.
	readAll claimRead = iota
	// readOthers reads the whole row unless it holds the claim's token,
	// for a claim whose token is new: its own row is the insert's.
	readOthers
	// readPeek reads only what classifies the key (no stored result), unless
	// the row holds the claim's token. It goes with the claim when the
	// driver pipelines (pgx: with BEGIN, so a duplicate costs one round
	// trip); otherwise peekAfter runs it once the insert found the key
	// taken (database/sql sends BEGIN alone, so the read queued with the
	// claim would save a duplicate no round trip against a hand-written
	// transaction and cost every new key its statement).
	readPeek
	// readLater queues no read: the caller reads a key that the insert found
	// taken after the round (Inbox.Claim over pgx, when none of the inbox's
	// recent claims found its key taken: internal/direct.Ahead).
	readLater
)

// queueClaim queues the claim's insert and, behind it, the read of the key,
// so that a key that exists is classified without another round trip. The
// results land in the returned round when the batch is closed.
func (i *Inbox) queueClaim(b *pgx.Batch, r *claimReq, read claimRead) *claimRound {
	var (
		round *claimRound
		rr    *readRound
	)
	if read == readPeek || read == readLater {
		round = &claimRound{}
	} else {
		rr = &readRound{}
		round = &rr.claimRound
	}
	args := i.claimArgs(r)
	b.Queue(i.q.claimInsert, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(round.row.dest()...)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		round.inserted = err == nil
		return err
	})
	if read == readLater {
		return round
	}
	if read == readPeek {
		if !i.drv.Pipelines() {
			round.later = args // for peekAfter
			return round
		}
		// The peek reuses the claim's arguments: no conversion twice.
		b.Queue(i.q.peek, args[claimArgNow], args[claimArgScope], args[claimArgKey], args[claimArgToken]).QueryRow(func(row pgx.Row) error {
			return round.scanPeek(row, r.key)
		})
		return round
	}
	var q *pgx.QueuedQuery
	if read == readOthers {
		q = b.Queue(i.q.lookupOther, args[claimArgNow], args[claimArgScope], args[claimArgKey], args[claimArgToken])
	} else {
		q = b.Queue(i.q.lookup, args[claimArgNow], args[claimArgScope], args[claimArgKey])
	}
	q.QueryRow(func(row pgx.Row) error {
		if round.inserted && pgbatch.SkipRow(row) {
			return nil // sent one by one: a new key needs no read
		}
		d := &rr.read
		if err := row.Scan(d.dest()...); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		}
		rec, err := d.record()
		round.rec = rec
		return err
	})
	return round
}

// peekedRow is what a peek read: the existing row, and its state as
// scanned, in one allocation, made only for a key that exists when the
// round is decoded by the direct round (a new key, the common case, reads
// no row).
type peekedRow struct {
	rec   Record
	state string
}

// scanPeek scans what the peek of key read into the round: the existing
// row, or none.
func (round *claimRound) scanPeek(row pgx.Row, key Key) error {
	p := &peekedRow{}
	rec := &p.rec
	rec.Key = key
	err := row.Scan(&p.state, &rec.Attempts, &rec.Token, &rec.LockedUntil, &rec.Key.Fingerprint, &rec.ReadAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	rec.State = State(p.state)
	round.rec = rec
	return err
}

// peekAfter runs, through q, the peek that a claim queued with readPeek
// left out (a driver that does not pipeline), when its insert found the key
// taken; it does nothing otherwise. In READ
// COMMITTED the statement takes a fresh snapshot, so it sees the row of a
// transaction that committed while the insert waited.
func (i *Inbox) peekAfter(ctx context.Context, q Querier, r *claimReq, round *claimRound) error {
	a := round.later
	if a == nil || round.inserted {
		return nil
	}
	return translate(round.scanPeek(q.QueryRow(ctx, i.q.peek, a[claimArgNow], a[claimArgScope], a[claimArgKey], a[claimArgToken]), r.key))
}

// settle turns a claim round into the claim's outcome. A key that was
// inserted is claimed. One that exists is classified; its own token (a
// retry of a claim whose reply was lost) is claimed; one in flight with an
// expired lease is taken over through q, with the upsert that re-checks the
// condition on the row lock. extra reports whether settle ran statements of
// its own after the round (a takeover), after which a savepoint taken in the
// round no longer follows the claim.
func (i *Inbox) settle(ctx context.Context, q Querier, r *claimReq, round *claimRound, sent time.Time) (c *Claim, extra bool, err error) {
	for try := 0; ; try++ {
		if round.inserted {
			return r.claimed(i, &round.row, sent), extra, nil
		}
		rec := round.rec
		if rec != nil && rec.Token == r.token && rec.State != StateFailed {
			// Our own claim, committed by a statement whose reply was lost.
			left := rec.leaseLeft()
			return r.claimed(i, &claimRow{state: string(rec.State), attempts: rec.Attempts,
				lockedUntil: rec.LockedUntil, left: left}, sent), extra, nil
		}
		if rec != nil && (!rec.expiredLease() || conflicts(r.key, rec)) {
			return classify(r.key, rec), extra, nil
		}
		if try == 3 {
			return nil, extra, fmt.Errorf("%w: key %s changed under every attempt to claim it", ErrRetryable, r.key)
		}
		// Absent (released, purged or rolled back since the insert looked)
		// or in flight with an expired lease: its holder died or its attempt
		// failed. Take it over (or insert it) atomically, or find it
		// poisoned.
		extra = true
		sent = time.Now()
		round = &claimRound{}
		args := append(i.claimArgs(r), r.maxAttempts)
		err := q.QueryRow(ctx, i.q.claim, args...).Scan(round.row.dest()...)
		switch {
		case err == nil:
			if State(round.row.state) == StateFailed {
				return &Claim{Key: r.key, Outcome: OutcomePoisoned, Attempt: round.row.attempts, inbox: i}, extra, nil
			}
			round.inserted = true
			continue
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, extra, translate(err)
		}
		if round.rec, err = i.lookup(ctx, q, r.key); err != nil && !errors.Is(err, ErrNotFound) {
			return nil, extra, err
		}
	}
}

// claimed is the claim of a row this request holds.
func (r *claimReq) claimed(i *Inbox, row *claimRow, sent time.Time) *Claim {
	c := &Claim{Key: r.key, Outcome: OutcomeClaimed, Token: r.token, Attempt: row.attempts, inbox: i,
		sent: sent, sentClock: i.cfg.now()}
	c.setLease(row.lockedUntil, row.left, sent)
	return c
}

// expiredLease reports whether the row is in flight with a lease that ran
// out when it was read (on the database's clock).
func (rec *Record) expiredLease() bool {
	return rec.State == StateInFlight && rec.LockedUntil != nil && !rec.LockedUntil.After(rec.ReadAt)
}

// leaseLeft is how much of the row's lease was left when it was read.
func (rec *Record) leaseLeft() *time.Duration {
	if rec.LockedUntil == nil {
		return nil
	}
	d := rec.LockedUntil.Sub(rec.ReadAt)
	return &d
}

// classify turns an existing row that the claim did not take into an outcome.
func classify(key Key, rec *Record) *Claim {
	c := new(Claim)
	classifyInto(c, key, rec)
	return c
}

// classifyInto is classify into a claim the caller allocated.
func classifyInto(c *Claim, key Key, rec *Record) {
	*c = Claim{Key: key, Attempt: rec.Attempts}
	if rec.LockedUntil != nil {
		c.LockedUntil = *rec.LockedUntil
	}
	switch {
	case conflicts(key, rec):
		c.Outcome = OutcomeConflict
	case rec.State == StateComplete:
		c.Outcome = OutcomeDuplicate
		c.Result = rec.Result
		if c.Result == nil {
			c.Result = &Result{}
		}
	case rec.State == StateFailed:
		c.Outcome = OutcomePoisoned
	default:
		c.Outcome = OutcomeInFlight
	}
}

// conflicts reports whether key's fingerprint differs from the stored one.
func conflicts(key Key, rec *Record) bool {
	return len(key.Fingerprint) > 0 && len(rec.Key.Fingerprint) > 0 && string(key.Fingerprint) != string(rec.Key.Fingerprint)
}

// reentrant refuses a claim of the key that the context's handler is
// handling: from a new transaction it would wait on its own uncommitted
// claim forever.
func (i *Inbox) reentrant(ctx context.Context, key Key) error {
	held := ClaimFromContext(ctx)
	if held == nil || held.inbox == nil || held.inbox.table != i.table ||
		held.Key.Scope != key.Scope || held.Key.ID != key.ID {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrReentrant, key)
}

// StoreResultTx stores r with a claim made in transactional mode (Claim,
// ClaimBatch), inside the same transaction tx, so that duplicates get r back
// once tx commits. It is refused with ErrLeaseLost when the claim is not
// this transaction's.
func (i *Inbox) StoreResultTx(ctx context.Context, tx Querier, c *Claim, r Result) error {
	args, err := storeResultArgs(c, r, "StoreResultTx")
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, i.q.storeResult, args...)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return leaseLost(c)
	}
	return nil
}

// QueueStoreResult queues in b what StoreResultTx does, for a caller that
// sends the transaction's COMMIT in the same round trip: queue the COMMIT
// after it in b, and send b on the connection that holds the transaction
// (pgx's Conn.SendBatch), so that storing the result and committing cost
// one round trip.
//
// Unlike StoreResultTx's, the queued statement fails when the claim is not
// this transaction's, aborting the transaction so that the COMMIT behind it
// cannot commit the effects without the result; the batch's Close then
// returns an error matching ErrLeaseLost. The preconditions are those of
// StoreResultTx, checked before anything is queued. Over database/sql, use
// StoreResultTx.
func (i *Inbox) QueueStoreResult(b *pgx.Batch, c *Claim, r Result) error {
	args, err := storeResultArgs(c, r, "QueueStoreResult")
	if err != nil {
		return err
	}
	b.Queue(i.q.storeResultOrFail, args...).Fn = func(br pgx.BatchResults) error {
		_, err := br.Exec()
		if code, ok := pgerr.SQLState(err); ok && code == pgerr.DivisionByZero {
			return wrap(leaseLost(c), err)
		}
		return translate(err)
	}
	return nil
}

// storeResultArgs checks that c is held and returns the arguments of the
// statements that store r with it (sqlStoreResult).
func storeResultArgs(c *Claim, r Result, op string) ([]any, error) {
	if err := mustHold(c, op); err != nil {
		return nil, err
	}
	headers, err := headerjson.Arg(r.Headers)
	if err != nil {
		return nil, fmt.Errorf("dedupe: encode result headers: %w", bare(err))
	}
	return []any{c.Key.Scope, c.Key.ID, r.Status, headers, r.Body, c.Token}, nil
}

// RecordFailure counts a failed transactional attempt of key after its
// transaction rolled back (the claim went with it), for adapters that run
// handlers themselves; Consumer.Handle does this on its own. When the
// attempts (Config.MaxAttempts) are used up, or cause is Permanent, the key is
// marked failed and poisoned is true. A key that meanwhile completed, or that
// a live lease holds, is left alone and attempts is 0.
func (i *Inbox) RecordFailure(ctx context.Context, key Key, cause error) (attempts int, poisoned bool, err error) {
	if err := key.Validate(); err != nil {
		return 0, false, err
	}
	return i.recordFailure(ctx, key, cause, i.cfg.maxAttemptsParam())
}

func (i *Inbox) recordFailure(ctx context.Context, key Key, cause error, maxAttempts int) (int, bool, error) {
	var (
		state    string
		attempts int
	)
	err := i.db.QueryRow(ctx, i.q.recordFailure, i.cfg.now(), key.Scope, key.ID, key.Fingerprint,
		maxAttempts, IsPermanent(cause), errorText(cause), i.cfg.Retention).Scan(&state, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, translate(err)
	}
	return attempts, State(state) == StateFailed, nil
}

// errorText is the last_error stored for cause.
func errorText(cause error) string {
	if cause == nil {
		return "failed"
	}
	return cause.Error()
}
