package dedupe

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/pgerr"
)

// TxBatchHandlerFunc processes the new messages of a batch inside tx, the
// transaction that holds their claims: their effects commit together with
// the claims, or not at all. TTx is the transaction type of the inbox's
// driver, as for TxHandlerFunc.
type TxBatchHandlerFunc[TTx, M any] func(ctx context.Context, tx TTx, msgs []M) error

// BatchHandlerFunc is the batch handler of an inbox over pgx.
type BatchHandlerFunc[M any] = TxBatchHandlerFunc[pgx.Tx, M]

// BatchResult is what one message of a batch came to: the outcome and error
// Consumer.Handle would have returned for it alone.
type BatchResult struct {
	Outcome Outcome
	Err     error
}

// BatchConsumer handles the messages a transport delivers in batches (a
// Kafka fetch, a JetStream pull) in one transaction per batch: one statement
// claims every key, the handler runs for the new ones, and one commit makes
// claims and effects durable. It keeps every guarantee of Consumer: the
// handler gets the same guarded transaction, a lost COMMIT reply is
// resolved, and attempts are counted in the transaction that held the claim.
// It is safe for concurrent use.
//
// Order is kept as a partitioned transport needs it: when a handler fails,
// the batch's effects roll back to the savepoint taken after the claims; the
// failing message's attempt is recorded while its claim is still held (so it
// runs at most MaxAttempts times, as under Consumer), the other claims are
// given back, and that commits. The messages before the failing one are then
// handled again as a batch, and the messages after it are returned
// unattempted (ErrNotAttempted) for the transport to deliver again in order. A BatchHandlerFunc's failure cannot be pinned on one
// message, so the batch is then handled one message per transaction, in
// order, up to the first that fails; the failed run of the whole batch counts
// as no one's attempt.
type BatchConsumer[M any] struct {
	txDriver
	cfg  ConsumerConfig[M]
	each func(ctx context.Context, tx any, msg M) error    // per-message handler, or
	all  func(ctx context.Context, tx any, msgs []M) error // batch handler
	one  *Consumer[M]                                      // per-message transactions, when a batch cannot run
}

// NewBatchConsumer returns a BatchConsumer that runs h for each new message
// of a batch, in the batch's transaction; the handler finds its claim with
// ClaimFromContext (and may SetResult) as under Consumer.
func NewBatchConsumer[M, TTx any](inbox *Inbox, cfg ConsumerConfig[M], h TxHandlerFunc[TTx, M]) (*BatchConsumer[M], error) {
	if h == nil {
		return nil, &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	if inbox == nil {
		return nil, &ConfigError{Field: "inbox", Reason: "must not be nil"}
	}
	each, err := eraseTx(inbox.drv, h)
	if err != nil {
		return nil, err
	}
	return newBatchConsumer(inbox, cfg, each, nil)
}

// NewBatchConsumerFunc returns a BatchConsumer whose handler gets all new
// messages of a batch in one call (one multi-row insert, say).
func NewBatchConsumerFunc[M, TTx any](inbox *Inbox, cfg ConsumerConfig[M], h TxBatchHandlerFunc[TTx, M]) (*BatchConsumer[M], error) {
	if h == nil {
		return nil, &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	if inbox == nil {
		return nil, &ConfigError{Field: "inbox", Reason: "must not be nil"}
	}
	all, err := eraseTx(inbox.drv, h)
	if err != nil {
		return nil, err
	}
	return newBatchConsumer(inbox, cfg, nil, all)
}

func newBatchConsumer[M any](inbox *Inbox, cfg ConsumerConfig[M], each func(context.Context, any, M) error,
	all func(context.Context, any, []M) error) (*BatchConsumer[M], error) {
	d, err := newTxDriver(inbox, &cfg)
	if err != nil {
		return nil, err
	}
	// Its COMMIT, and that of its per-message transactions, proves that
	// the transaction still holds the claims (checkCommits), as a
	// Consumer's does.
	d.checkCommits()
	b := &BatchConsumer[M]{txDriver: d, cfg: cfg, each: each, all: all}
	// The batch's Observer calls cover these per-message transactions too.
	b.one = &Consumer[M]{txDriver: d, cfg: cfg, handler: b.runOne, unobserved: true}
	return b, nil
}

// Scope returns the consumer's scope.
func (b *BatchConsumer[M]) Scope() string { return b.cfg.Scope }

// KeyOf returns the key the consumer claims for msg, validated.
func (b *BatchConsumer[M]) KeyOf(msg M) (Key, error) { return keyOf(&b.cfg, msg) }

// runOne is the handler of one message on its own.
func (b *BatchConsumer[M]) runOne(ctx context.Context, tx any, msg M) error {
	if b.each != nil {
		return b.each(ctx, tx, msg)
	}
	return b.all(ctx, tx, []M{msg})
}

// HandleBatch handles msgs and returns one result per message, in order,
// each what Consumer.Handle would have returned for it, or ErrNotAttempted
// for a message after one that failed. A message without a usable key gets
// ErrNoKey or ErrInvalidKey and the others go on.
//
// A handler that ends the batch's transaction itself (a COMMIT or ROLLBACK
// sent as a statement, perhaps followed by BEGIN) never has a message
// reported processed for work that did not commit: the COMMIT proves, as
// Consumer's does, that the transaction still holds the claims (the
// savepoint taken after them), in the COMMIT's own round trip over pgx.
// As under Consumer, a message whose handler ended the transaction never
// runs again: what it wrote after the end may have committed on its own.
// With a per-message handler over pgx the guard pins the end on the
// message whose handler left the transaction ended: that message gets
// OutcomePoisoned with ErrTxEnded (its key marked failed), the ones before
// it are handled again and the ones after it get ErrNotAttempted. Where the
// end cannot be pinned on one message (a transaction ended and begun again,
// which its COMMIT refuses; a batch handler; over database/sql, which has
// no guard), every new message of the batch whose handler ran gets
// OutcomePoisoned with ErrTxEnded, so that none of them runs again; claims a
// handler committed itself are released first, and a message whose handler
// had not run yet gets ErrNotAttempted.
//
// When the batch cannot run
// as one (a serialization failure after TxRetries, a key whose lock times
// out, a database error), its messages are handled one transaction each, in
// order, up to the first that fails.
func (b *BatchConsumer[M]) HandleBatch(ctx context.Context, msgs []M) []BatchResult {
	res := make([]BatchResult, len(msgs))
	keys := make([]Key, len(msgs))
	var valid []int
	for n, m := range msgs {
		k, err := b.KeyOf(m)
		if err == nil {
			err = b.inbox.reentrant(ctx, k)
		}
		if err != nil {
			res[n] = BatchResult{Err: err}
			continue
		}
		keys[n] = k
		valid = append(valid, n)
	}
	if len(valid) == 0 {
		return res
	}
	if b.inbox.cfg.Observer == nil {
		b.handle(ctx, nil, msgs, keys, valid, res)
		return res
	}
	// Each message's handling is observed on its own, and its handler (or
	// its transaction of its own, when the batch falls back) runs with the
	// context the Observer returned for it, which carries its MessageInfo.
	dones := make([]func(Outcome, int, error), len(valid))
	mctx := make([]context.Context, len(msgs))
	for j, n := range valid {
		mctx[n], dones[j] = observeMsg(ctx, b.inbox, &b.cfg, keys[n], "batch", msgs[n])
	}
	b.handle(ctx, mctx, msgs, keys, valid, res)
	for j, n := range valid {
		attempt := 0
		var he *HandlerError
		if errors.As(res[n].Err, &he) {
			attempt = he.Attempt
		}
		dones[j](res[n].Outcome, attempt, res[n].Err)
	}
	return res
}

// handle handles the messages at valid (their keys valid) as one batch,
// running the transaction again after a serialization failure, and one
// message per transaction, in order, when the batch cannot run as one.
// mctx holds each message's own context (by index into msgs), or is nil
// when the handlings are not observed.
func (b *BatchConsumer[M]) handle(ctx context.Context, mctx []context.Context, msgs []M, keys []Key, valid []int, res []BatchResult) {
	for try := 0; ; try++ {
		err := b.batchTx(ctx, mctx, msgs, keys, valid, res)
		switch {
		case err == nil:
			return
		case errors.Is(err, ErrRetryable) && try < b.cfg.TxRetries && ctx.Err() == nil:
			continue
		}
		if ctx.Err() == nil && !errors.Is(err, ErrInFlight) {
			b.inbox.cfg.Logger.WarnContext(ctx, "dedupe: batch failed; handling it one message at a time", "err", err)
		}
		b.inOrder(ctx, mctx, msgs, keys, valid, res)
		return
	}
}

// msgCtx is the context of the message at n: its own when the handlings
// are observed, else ctx.
func msgCtx(ctx context.Context, mctx []context.Context, n int) context.Context {
	if mctx != nil {
		return mctx[n]
	}
	return ctx
}

// batchTx runs one transaction for the messages at valid and fills their
// results. An error means nothing committed and no result was filled.
func (b *BatchConsumer[M]) batchTx(ctx context.Context, mctx []context.Context, msgs []M, keys []Key, valid []int, res []BatchResult) error {
	inbox := b.inbox
	tx, err := b.begin(ctx, b.beginBatch())
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	batchKeys := make([]Key, len(valid))
	for j, n := range valid {
		batchKeys[j] = keys[n]
	}
	// The savepoint taken after the claims is what the checked COMMIT
	// releases (checkCommits), and what a failing message's effects roll
	// back to. Over pgx it goes with the claim, in its round trip; over
	// database/sql (whose plain COMMIT of a batch without new claims needs
	// none) below, once there is a new claim.
	pipelined := inbox.drv.Pipelines()
	claims, err := inbox.claimBatch(ctx, tx, batchKeys, b.maxAttempts, pipelined)
	if err != nil {
		return err
	}
	var (
		fresh  []int // indexes into valid of the claimed messages
		commit bool  // a takeover marked a key failed: keep that
	)
	out := make([]BatchResult, len(valid))
	for j, c := range claims {
		switch c.Outcome {
		case OutcomeClaimed:
			fresh = append(fresh, j)
		case OutcomeDuplicate:
			out[j] = BatchResult{Outcome: OutcomeDuplicate}
		case OutcomePoisoned:
			commit = true
			out[j] = BatchResult{Outcome: OutcomePoisoned, Err: fmt.Errorf("%w: %s", ErrPoisoned, c.Key)}
		default:
			out[j] = BatchResult{Outcome: c.Outcome, Err: fmt.Errorf("%w: %s", c.Outcome.Err(), c.Key)}
		}
	}
	if len(fresh) == 0 {
		if commit {
			if err := tx.Commit(ctx); err != nil {
				return translate(err)
			}
		}
		copyResults(res, valid, out)
		return nil
	}
	if !pipelined {
		if _, err := tx.Exec(ctx, sqlSavepoint); err != nil {
			return translate(err)
		}
	}
	failedAt, herr := b.runBatch(ctx, mctx, tx, msgs, valid, fresh, claims)
	if herr == nil {
		outcome, cerr := b.commit(ctx, tx, claims[fresh[0]])
		switch {
		case errors.Is(cerr, errEndedBehind):
			// A handler ended the transaction, and which one cannot be
			// told (see endedAll): nothing of it commits now, and none of
			// the new messages runs again.
			_ = tx.Rollback(context.WithoutCancel(ctx))
			b.releaseCommitted(ctx, fresh, claims)
			b.endedAll(ctx, fresh, claims, b.endedCause(cerr, nil), out)
			copyResults(res, valid, out)
			return nil
		case errors.Is(cerr, errFailedTx):
			// A handler swallowed a failed statement (database/sql shows
			// it only at COMMIT): nothing committed; find the message one
			// transaction at a time.
			_ = tx.Rollback(context.WithoutCancel(ctx))
			b.inOrder(ctx, mctx, msgs, keys, valid, res)
			return nil
		}
		for _, j := range fresh {
			out[j] = BatchResult{Outcome: outcome, Err: cerr}
		}
		copyResults(res, valid, out)
		return nil
	}
	if _, err, done := b.notAnAttempt(ctx, claims[fresh[0]], herr); done {
		return err // retryable, or cancelled: nothing committed
	}
	if failedAt < 0 {
		ended := tx.Ended() || b.claimsLost(ctx, tx)
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if ended {
			// A batch handler ended the transaction itself (see endedAll).
			b.releaseCommitted(ctx, fresh, claims)
			b.endedAll(ctx, fresh, claims, b.endedCause(herr, nil), out)
			copyResults(res, valid, out)
			return nil
		}
		b.inOrder(ctx, mctx, msgs, keys, valid, res)
		return nil
	}
	n := valid[failedAt]
	// pinned: the guard saw this message's handler leave the transaction
	// ended (pgx); otherwise an end found below may be any handler's.
	pinned := tx.Ended()
	ended := pinned
	if !ended {
		// Record the failing message's attempt while its claim is held,
		// give back the claims of the others, and commit just that.
		poisoned, attempts, err := b.recordFailedTx(ctx, tx, sqlSavepointName, claims[failedAt], herr)
		if err == nil {
			err = b.unclaim(ctx, tx, fresh, failedAt, claims)
		}
		if err == nil {
			err = translate(tx.Commit(ctx))
		}
		// database/sql learns only now that the handler ended it.
		if ended = errors.Is(err, ErrTxEnded); !ended {
			res[n].Outcome, res[n].Err = b.report(ctx, claims[failedAt], herr, poisoned, attempts, err)
		}
	}
	if ended {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if !pinned {
			// Over database/sql, or a transaction begun again: the end may
			// be the work of any handler that ran. None of them runs again;
			// the messages after the failing one did not run.
			b.releaseCommitted(ctx, fresh, claims)
			ran := fresh[:slices.Index(fresh, failedAt)+1]
			b.endedAll(ctx, ran, claims, b.endedCause(herr, nil), out)
			for _, j := range fresh[len(ran):] {
				out[j] = BatchResult{Outcome: OutcomeRetry, Err: ErrNotAttempted}
			}
			copyResults(res, valid, out)
			return nil
		}
		b.endedAt(ctx, keys, valid, fresh, claims, failedAt, b.endedCause(herr, nil), res)
	}
	// The messages before the failing one, again as a batch; the ones after
	// it wait for their redelivery, so that order is kept. This transaction
	// ends first (a no-op once committed): when its record failed (its
	// connection died under the handler, a reply was lost) it still holds
	// its connection, and the claims of those very messages if the
	// connection lives; the batch that follows would wait for either
	// forever, on a pool of few connections or on its own claims.
	_ = tx.Rollback(context.WithoutCancel(ctx))
	if failedAt > 0 {
		b.handle(ctx, mctx, msgs, keys, valid[:failedAt], res)
	}
	for _, m := range valid[failedAt+1:] {
		res[m] = BatchResult{Outcome: OutcomeRetry, Err: ErrNotAttempted}
	}
	return nil
}

// unclaim gives back, in tx, the claims of fresh other than failedAt's.
func (b *BatchConsumer[M]) unclaim(ctx context.Context, tx Querier, fresh []int, failedAt int, claims []*Claim) error {
	var scopes, ids []string
	var tokens []int64
	for _, j := range fresh {
		if j != failedAt {
			scopes, ids, tokens = append(scopes, claims[j].Key.Scope), append(ids, claims[j].Key.ID), append(tokens, claims[j].Token)
		}
	}
	if len(scopes) == 0 {
		return nil
	}
	q := &pgx.Batch{}
	now := b.inbox.cfg.now()
	q.Queue(b.inbox.q.unclaimNew, now, scopes, ids, tokens)
	q.Queue(b.inbox.q.unclaimTaken, now, scopes, ids, tokens)
	return translate(sendBatch(ctx, tx, q))
}

// endedAt records a batch whose handler ended the transaction itself at the
// message failedAt. If it committed, it took the claims of the messages
// whose handler had not run yet along: those are released again. The
// failing message's attempt is counted on its own.
func (b *BatchConsumer[M]) endedAt(ctx context.Context, keys []Key, valid, fresh []int, claims []*Claim,
	failedAt int, herr error, res []BatchResult) {
	for _, j := range fresh {
		if j > failedAt {
			k := keys[valid[j]]
			if _, err := b.inbox.db.Exec(ctx, b.inbox.q.releaseToken, k.Scope, k.ID, claims[j].Token); err != nil {
				b.inbox.cfg.Logger.ErrorContext(ctx, "dedupe: release a claim committed behind dedupe's back",
					"scope", k.Scope, "key", k.ID, "err", err)
			}
		}
	}
	n := valid[failedAt]
	attempts, poisoned, err := b.inbox.recordFailure(ctx, keys[n], herr, b.maxAttempts)
	res[n].Outcome, res[n].Err = b.report(ctx, claims[failedAt], herr, poisoned, attempts, err)
}

// claimsLost reports whether tx, whose handler failed, no longer holds the
// claims: the rollback to the savepoint taken after them finds no
// transaction open, or another one (a handler ended it, then perhaps began
// again). A round trip, on this failure path only.
func (b *BatchConsumer[M]) claimsLost(ctx context.Context, tx txConn) bool {
	_, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sqlSavepointName)
	return errors.Is(translate(err), ErrTxEnded)
}

// releaseCommitted releases the claims of fresh that a handler committed
// itself (a COMMIT sent as a statement) and reports whether there was any.
func (b *BatchConsumer[M]) releaseCommitted(ctx context.Context, fresh []int, claims []*Claim) bool {
	i := b.inbox
	found := false
	for _, j := range fresh {
		c := claims[j]
		tag, err := i.db.Exec(ctx, i.q.releaseToken, c.Key.Scope, c.Key.ID, c.Token)
		if err != nil {
			i.cfg.Logger.ErrorContext(ctx, "dedupe: release a claim committed behind dedupe's back",
				"scope", c.Key.Scope, "key", c.Key.ID, "err", err)
			found = true // it may have committed: assume it did
			continue
		}
		found = found || tag.RowsAffected() > 0
	}
	return found
}

// endedAll records a batch whose transaction a handler ended where which
// handler did it cannot be told: one ended and begun again (refused by its
// COMMIT or by the rollback to the claims' savepoint), a batch handler's,
// or over database/sql, which has no guard (the statements sent after that
// end, by that handler and by the handlers after it, ran outside any
// transaction, each committing on its own); claims a handler committed
// itself were released by releaseCommitted. Running any of them again could
// repeat an effect, so every message of fresh is recorded failed with cause
// (Permanent, ErrTxEnded): reported OutcomePoisoned, never processed, its
// key marked failed.
func (b *BatchConsumer[M]) endedAll(ctx context.Context, fresh []int, claims []*Claim, cause error, out []BatchResult) {
	i := b.inbox
	for _, j := range fresh {
		c := claims[j]
		attempts, poisoned, err := i.recordFailure(ctx, c.Key, cause, b.maxAttempts)
		out[j].Outcome, out[j].Err = b.report(ctx, c, cause, poisoned, attempts, err)
	}
}

// runBatch runs the handler over the claimed messages; failedAt is the index
// into valid of the failing message (-1 when a batch handler failed). A
// per-message handler runs with its message's context (see handle).
func (b *BatchConsumer[M]) runBatch(ctx context.Context, mctx []context.Context, g txConn, msgs []M, valid, fresh []int, claims []*Claim) (int, error) {
	if b.all != nil {
		batch := make([]M, len(fresh))
		for k, j := range fresh {
			batch[k] = msgs[valid[j]]
		}
		return -1, runGuarded(g, func() error { return b.all(ctx, g.HandlerTx(), batch) })
	}
	for _, j := range fresh {
		c := claims[j]
		c.pending = nil
		n := valid[j]
		err := runGuarded(g, func() error { return b.each(contextWithClaim(msgCtx(ctx, mctx, n), c), g.HandlerTx(), msgs[n]) })
		if err == nil && c.pending != nil {
			err = b.inbox.StoreResultTx(ctx, g, c, *c.pending)
		}
		if err != nil {
			if code, ok := pgerr.SQLState(err); ok && code == pgerr.InFailedTx {
				// The transaction was aborted before this message's turn:
				// an earlier handler swallowed a failed statement, which a
				// *sql.Tx cannot show at once. Blame no one here; the
				// messages run one transaction each and find the culprit.
				return -1, err
			}
			return j, err
		}
	}
	return -1, nil
}

// inOrder handles the messages at valid one transaction each, in order, up
// to the first that is not settled; the rest are returned unattempted.
func (b *BatchConsumer[M]) inOrder(ctx context.Context, mctx []context.Context, msgs []M, keys []Key, valid []int, res []BatchResult) {
	for k, n := range valid {
		o, err := b.one.HandleKey(msgCtx(ctx, mctx, n), keys[n], msgs[n])
		res[n] = BatchResult{Outcome: o, Err: err}
		if err != nil {
			for _, m := range valid[k+1:] {
				res[m] = BatchResult{Outcome: OutcomeRetry, Err: ErrNotAttempted}
			}
			return
		}
	}
}

func copyResults(res []BatchResult, valid []int, out []BatchResult) {
	for j, n := range valid {
		res[n] = out[j]
	}
}
