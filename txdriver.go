package dedupe

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/pgerr"
	"github.com/exactlyonce/dedupe/internal/sqldb"
)

// txDriver is what Consumer and BatchConsumer share: how a claim's
// transaction begins, how a handler runs in it, how a failed attempt is
// recorded and how the transaction commits.
type txDriver struct {
	inbox       *Inbox
	txOpts      pgx.TxOptions
	settings    string // sqlTxSettings's argument (txopts.Settings); "" for none
	syncCommit  string // ConsumerConfig.SynchronousCommit
	maxAttempts int    // 0 = no limit
	// directBegin is the BEGIN of the direct claim round over pgx
	// (driver.go, internal/direct); nil where the driver cannot send it.
	directBegin *direct.Begin
	// checked is set for a Consumer: its COMMIT proves that the
	// transaction still holds the claim (checkCommits).
	checked bool
}

// Inbox returns the consumer's inbox.
func (d *txDriver) Inbox() *Inbox { return d.inbox }

// beginBatch returns the statements that follow BEGIN in the claim's
// transaction (its settings: lock timeout, synchronous_commit), for the
// claim statements to be queued behind: with pgx, one round trip for all of
// them.
func (d *txDriver) beginBatch() *pgx.Batch {
	b := d.inbox.drv.NewBatch(d.txOpts)
	if d.settings != "" {
		b.Queue(sqlTxSettings, d.settings)
	}
	return b
}

// beginClaim begins the claim's transaction and claims r in it, with the
// read of an existing key queued behind the claim and the savepoint taken
// right after it: with pgx in one round trip, straight over pgconn where the
// driver can (driver.go, internal/direct). savepoint reports whether the savepoint was
// taken (a driver that sends statements one by one takes it only for a new
// key).
func (d *txDriver) beginClaim(ctx context.Context, r *claimReq) (tx txConn, round *claimRound, savepoint bool, err error) {
	tx, round, err = d.inbox.claimDirect(ctx, d.directBegin, d.txOpts, d.settings, r)
	if !errors.Is(err, direct.ErrTypes) && !errors.Is(err, direct.ErrNoDirect) {
		return tx, round, true, translate(err)
	}
	b := d.beginBatch()
	round = d.inbox.queueClaim(b, r, readPeek)
	taken := queueSavepoint(d.inbox.drv, b, round)
	if tx, err = d.begin(ctx, b); err != nil {
		return nil, nil, false, err
	}
	if err := d.inbox.peekAfter(ctx, tx, r, round); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, nil, false, err
	}
	return tx, round, *taken, nil
}

// begin begins the claim's transaction and runs b in it.
func (d *txDriver) begin(ctx context.Context, b *pgx.Batch) (txConn, error) {
	tx, err := d.inbox.drv.Begin(ctx, d.txOpts, b)
	return tx, translate(err)
}

// runGuarded runs a handler call, turning a panic into a *PanicError, and
// refuses a nil return from a handler that ended or aborted g behind
// dedupe's back.
func runGuarded(g txConn, call func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	if err := call(); err != nil {
		return err
	}
	return checkGuard(g)
}

// errFailedTx is a COMMIT refused because the transaction had failed: the
// handler's attempt failed, though it returned nil.
var errFailedTx = fmt.Errorf("%w (rolled back)", ErrTxEnded)

// inFlightOr reports a lock timeout as OutcomeInFlight, any other error as is.
func inFlightOr(err error) (Outcome, error) {
	if errors.Is(err, ErrInFlight) {
		return OutcomeInFlight, err
	}
	return 0, err
}

// checkCommits makes the transactions of a Consumer commit only while they
// hold their claim: over pgx their COMMIT is sqlCommitClaim (one simple
// query, the round trip of COMMIT alone); over database/sql, commitClaim.
func (d *txDriver) checkCommits() {
	d.txOpts.CommitQuery = sqlCommitClaim
	if d.directBegin != nil {
		d.directBegin = direct.NewBegin(d.txOpts)
	}
	d.checked = true
}

// commit commits the claim and its effects (checked: only while the
// transaction still holds the claim, see checkCommits). A COMMIT whose reply
// was lost is resolved on a fresh connection through claim (any claim of the
// transaction): committed is reported as claimed, not committed as an error,
// and an unanswerable question as OutcomeUnknown. A transaction found
// ended behind dedupe's back returns an error matching ErrTxEnded (and
// errEndedBehind), a failed one errFailedTx.
func (d *txDriver) commit(ctx context.Context, tx txConn, claim *Claim) (Outcome, error) {
	var err error
	if d.checked {
		err = tx.CommitClaim(ctx)
	} else {
		err = tx.Commit(ctx)
	}
	if err == nil {
		return OutcomeClaimed, nil
	}
	if pgerr.IsFailedTxCommit(err) {
		// A statement of the handler failed and it returned nil: what the
		// guard catches before COMMIT with pgx, a *sql.Tx shows only now.
		return OutcomeRetry, fmt.Errorf("%w: a statement failed and the handler returned nil: %w", errFailedTx, bare(err))
	}
	if !mayHaveApplied(err) {
		terr := translate(err)
		if errors.Is(terr, ErrTxEnded) && ctx.Err() == nil {
			return OutcomeRetry, wrap(errEndedBehind, terr)
		}
		return OutcomeNone, terr
	}
	log := d.inbox.cfg.Logger
	committed, rerr := d.inbox.Resolve(ctx, claim)
	switch {
	case rerr != nil:
		log.ErrorContext(ctx, "dedupe: commit reply lost and the outcome could not be learnt", "scope", claim.Key.Scope,
			"key", claim.Key.ID, "err", err, "resolve_err", rerr)
		if errors.Is(rerr, ErrOutcomeUnknown) {
			return OutcomeUnknown, rerr
		}
		return OutcomeUnknown, &OutcomeUnknownError{Op: "commit", Key: claim.Key, Err: errors.Join(err, rerr)}
	case committed:
		log.WarnContext(ctx, "dedupe: commit reply lost; the transaction committed", "scope", claim.Key.Scope,
			"key", claim.Key.ID, "err", err)
		return OutcomeClaimed, nil
	}
	return OutcomeNone, fmt.Errorf("dedupe: commit of %s failed and did not take effect: %w", claim.Key, bare(err))
}

// errEndedBehind is a claim's transaction that its COMMIT found ended
// behind dedupe's back (checkCommits): nothing of it was reported
// processed; its handler's attempt is counted on its own.
var errEndedBehind = errors.New("dedupe: the transaction no longer held the claim at COMMIT")

// recordFailedTx turns the claim row of a failed attempt into its failure
// record inside tx, after the effects were rolled back to savepoint (the one
// taken right after the claim, or one of the handler's own): the attempt is
// counted and the key released or marked failed when tx commits. The
// rollback goes alone, as a simple query: a transaction aborted by the
// handler's failed statement refuses to prepare anything until it is rolled
// back.
func (d *txDriver) recordFailedTx(ctx context.Context, tx Querier, savepoint string, claim *Claim, herr error) (failed bool, attempts int, err error) {
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return false, 0, translate(err)
	}
	i := d.inbox
	var state string
	err = tx.QueryRow(ctx, i.q.failTx, i.cfg.now(), claim.Key.Scope, claim.Key.ID, claim.Token, d.maxAttempts,
		IsPermanent(herr), errorText(herr), i.cfg.Retention).Scan(&state, &attempts)
	return State(state) == StateFailed, attempts, translate(err)
}

// failed ends an attempt whose handler failed. Its effects roll back to the
// savepoint taken after the claim, the claim row becomes the failure record
// (attempt counted, key released or marked failed) and that commits: the
// claim was held all along, so no concurrent duplicate started an attempt
// this one did not count.
func (d *txDriver) failed(ctx context.Context, tx txConn, claim *Claim, herr error) (Outcome, error) {
	if o, err, done := d.notAnAttempt(ctx, claim, herr); done {
		return o, err
	}
	var (
		poisoned bool
		attempts int
		err      error
	)
	ended := tx.Ended() || errors.Is(herr, errEndedBehind)
	byHandler := ended
	if !ended {
		if poisoned, attempts, err = d.recordFailedTx(ctx, tx, sqlSavepointName, claim, herr); err == nil {
			err = translate(tx.Commit(ctx))
		}
		// database/sql learns only now that the handler ended it: the
		// claim's savepoint or transaction is gone. A *sql.Tx whose COMMIT
		// found it failed (errFailedTx) was ended by that COMMIT.
		ended = errors.Is(err, ErrTxEnded)
		byHandler = ended && (!errors.Is(herr, errFailedTx) || errors.Is(err, errTxIdle) || errors.Is(err, errTxRestarted))
	}
	if ended {
		// The handler ended the transaction; the claim went with it. Record
		// the key failed on its own, once the transaction has given its
		// connection back: on a pool of one connection the record would
		// wait for it.
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			// database/sql ended it as the context ended: a shutdown.
			o, err, _ := d.notAnAttempt(ctx, claim, herr)
			return o, err
		}
		if byHandler {
			herr = d.endedCause(herr, err)
		}
		attempts, poisoned, err = d.inbox.recordFailure(ctx, claim.Key, herr, d.maxAttempts)
	}
	return d.report(ctx, claim, herr, poisoned, attempts, err)
}

// endedCause is the failure recorded for an attempt whose handler ended the
// claim's transaction itself (herr, or err, the error that showed it): a
// Permanent one, so that its key is marked failed and a redelivery never
// runs the handler again. What the handler wrote after the end cannot be
// told: over pgx the guard refuses its later statements, but not the rest
// of a statement that ended the transaction ("ROLLBACK; INSERT ...", one
// simple-protocol query), nor what a transaction it began again and
// committed itself held; a *sql.Tx cannot be guarded at all. Any of that
// committed on its own, outside the claim, and would commit again.
func (d *txDriver) endedCause(herr, err error) error {
	if !errors.Is(herr, ErrTxEnded) {
		herr = errors.Join(herr, err)
	}
	return Permanent(wrap(errHandlerEnded, herr))
}

// errHandlerEnded is the cause of a key marked failed because its handler
// ended the claim's transaction itself (endedCause). It matches ErrTxEnded.
var errHandlerEnded error = handlerEnded{}

type handlerEnded struct{}

func (handlerEnded) Error() string {
	return "dedupe: the handler ended its transaction itself (a COMMIT or ROLLBACK sent as a statement); the key is marked failed so that nothing of it runs again"
}
func (handlerEnded) Is(target error) bool { return target == ErrTxEnded }

// notAnAttempt handles the handler failures that are not the message's
// fault: a cancelled context (shutdown) and a serialization failure or
// deadlock in the handler's own statements, after which the whole
// transaction runs again. done is false for a real failure.
func (d *txDriver) notAnAttempt(ctx context.Context, claim *Claim, herr error) (Outcome, error, bool) {
	if ctx.Err() != nil {
		if !errors.Is(herr, ctx.Err()) {
			// database/sql rolled the transaction back as the context
			// ended: the handler's error says so, not why.
			herr = wrap(herr, context.Cause(ctx))
		}
		return OutcomeRetry, &HandlerError{Key: claim.Key, Attempt: claim.Attempt, Err: herr}, true
	}
	if terr := translate(herr); errors.Is(terr, ErrRetryable) {
		return 0, terr, true
	}
	return 0, nil, false
}

// report turns a recorded (or unrecorded, err) failed attempt into the
// outcome and error Handle returns, and logs it.
func (d *txDriver) report(ctx context.Context, claim *Claim, herr error, poisoned bool, attempts int, err error) (Outcome, error) {
	key := claim.Key
	log := d.inbox.cfg.Logger
	if err != nil {
		// The failure record did not commit (or its reply was lost): the
		// effects are rolled back either way; the attempt may be uncounted.
		log.ErrorContext(ctx, "dedupe: record failed attempt", "scope", key.Scope, "key", key.ID, "err", err)
		return OutcomeRetry, &HandlerError{Key: key, Attempt: claim.Attempt, Err: errors.Join(herr, err)}
	}
	if attempts > 0 {
		claim.Attempt = attempts
	}
	he := &HandlerError{Key: key, Attempt: claim.Attempt, Err: herr, Poisoned: poisoned, Recorded: true}
	if poisoned {
		log.ErrorContext(ctx, "dedupe: key marked failed", "scope", key.Scope, "key", key.ID,
			"attempts", claim.Attempt, "err", herr)
		return OutcomePoisoned, he
	}
	log.WarnContext(ctx, "dedupe: handler failed", "scope", key.Scope, "key", key.ID,
		"attempt", claim.Attempt, "err", herr)
	return OutcomeRetry, he
}

// resolveTimeout bounds the resolution of a lost COMMIT reply: how long it
// waits for a transaction that still holds the key (its COMMIT not yet
// processed) and retries an unreachable database.
const resolveTimeout = 10 * time.Second

// Resolve learns whether the transaction that holds the transactional claim
// c (Claim, or a leased claim completed with CompleteTx) committed, after its
// COMMIT failed without a reply (an error matching neither a server error nor
// a refusal before sending: the connection broke after the COMMIT may have
// reached the server). It reads the claim's own row on a fresh connection:
// committed is true when the row is complete under c's token.
//
// The read first waits (up to 10s) for any transaction still holding the
// key, so a COMMIT that reached the server but is not processed yet is not
// mistaken for a rollback. Within the same bound it waits out a failover:
// a server starting up or shutting down (SQLSTATE 57P03) and a standby not
// yet promoted (read only) are tried again. When the database cannot answer in that time the
// error matches ErrOutcomeUnknown: then nothing may be assumed either way.
func (i *Inbox) Resolve(ctx context.Context, c *Claim) (committed bool, err error) {
	if err := mustHold(c, "Resolve"); err != nil {
		return false, err
	}
	state, ours, err := i.probe(ctx, c.Key, c.Token)
	if err != nil {
		return false, &OutcomeUnknownError{Op: "commit", Key: c.Key, Err: err}
	}
	if state == "" && !i.unpurged(c) {
		// No row: rolled back, or committed and purged since. Only a claim
		// younger than Retention cannot have been purged.
		return false, &OutcomeUnknownError{Op: "commit", Key: c.Key, Err: errMaybePurged}
	}
	return ours && state == StateComplete, nil
}

// errMaybePurged is a lost COMMIT whose key is absent when resolved, more
// than Retention after the claim: Purge may have deleted a committed claim.
var errMaybePurged = errors.New("the key is absent, and the claim is older than Retention: it may have committed and been purged since")

// unpurged reports whether c's row, had it committed, could not have been
// purged yet: it expires Retention after its claim at the earliest, and
// less than that has passed since the claim was sent (on this process's
// monotonic clock, which counts at least the database's elapsed time since
// the insert; on the test clock when the inbox has one).
func (i *Inbox) unpurged(c *Claim) bool {
	if c.sentClock != nil {
		now := i.cfg.now()
		return now != nil && now.Sub(*c.sentClock) < i.cfg.Retention
	}
	return !c.sent.IsZero() && time.Since(c.sent) < i.cfg.Retention
}

// probe reads key's committed row on a fresh connection, after waiting for
// any transaction that still holds it, and reports its state and whether it
// carries token. An absent key reports ours false and state "". It never
// changes anything: its transaction is always rolled back.
func (i *Inbox) probe(ctx context.Context, key Key, token int64) (State, bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	opts := pgx.TxOptions{BeginQuery: fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d", resolveTimeout.Milliseconds())}
	var err error
	policy := Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	for backoff := policy.Min; ; backoff = policy.Next(backoff) {
		var (
			state State
			ours  bool
		)
		state, ours, err = i.probeOnce(ctx, key, token, opts)
		if err == nil {
			return state, ours, nil
		}
		if errors.Is(err, ErrInFlight) || !pgerr.RetryableConn(err) {
			return "", false, err // a lock held past the timeout, or a real error
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", false, errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}

func (i *Inbox) probeOnce(ctx context.Context, key Key, token int64, opts pgx.TxOptions) (State, bool, error) {
	tx, err := i.drv.Begin(ctx, opts, nil)
	if err != nil {
		return "", false, translate(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the probe never commits
	probe := newToken()
	var (
		got   int64
		state string
	)
	if err := tx.QueryRow(ctx, i.q.resolve, i.cfg.now(), key.Scope, key.ID, probe).Scan(&got, &state); err != nil {
		return "", false, translate(err)
	}
	if got == probe {
		return "", false, nil // nothing committed under the key
	}
	return State(state), got == token, nil
}

// A transaction whose end belongs to dedupe (a Consumer's, httpidem's) can be
// ended by the code it is handed: a ROLLBACK or COMMIT sent as a statement,
// then perhaps BEGIN and more writes. Its COMMIT must then not report the
// work processed. The proof is the savepoint ClaimSavepoint, taken right
// after the claim (or BEGIN): only the transaction that took it holds it,
// and the COMMIT releases it first, in the same simple query (one round trip,
// as COMMIT alone), so that a transaction ended and begun again fails there
// and commits nothing. Consumer does this on its own; the functions below
// are for packages that own a transaction themselves (httpidem).

// ClaimSavepoint is the savepoint a checked COMMIT releases: take it with
// SAVEPOINT dedupe_claim right after the claim (or BEGIN), in the same round
// trip where the driver can.
const ClaimSavepoint = sqlSavepointName

// CheckedTxOptions returns opts with the checked COMMIT as pgx's
// CommitQuery: a pgx.Tx begun with them commits only while it still holds
// ClaimSavepoint. Pass its Commit's error through CommitError.
func CheckedTxOptions(opts pgx.TxOptions) pgx.TxOptions {
	opts.CommitQuery = sqlCommitClaim
	return opts
}

// CommitError maps the error of a checked COMMIT (CheckedTxOptions): a
// transaction that no longer held ClaimSavepoint (ended behind its owner's
// back, perhaps begun again) matches ErrTxEnded; nothing committed. Other
// errors are mapped as the package maps every driver error.
func CommitError(err error) error { return translate(err) }

// CommitSQLTx commits tx, a database/sql transaction that took
// ClaimSavepoint, only while it still holds it: a transaction ended behind
// its owner's back returns an error matching ErrTxEnded, is rolled back, and
// nothing of it commits. The check goes before the driver's COMMIT, one
// round trip more than tx.Commit (a Consumer's *sql.Tx over pgx's stdlib
// pays none: it holds the connection under the transaction). A transaction
// a failed statement aborted returns the driver's failed-commit error as
// tx.Commit does.
func CommitSQLTx(ctx context.Context, tx *sql.Tx) error {
	t := &sqldb.Tx{Querier: sqldb.Querier{R: tx}, SQL: tx}
	err := t.CommitClaim(ctx, sqlCommitClaim, sqlCheckClaim)
	if errors.Is(err, sqldb.ErrNoTx) {
		err = errTxIdle
	}
	return translate(err)
}
