package dedupe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe/internal/direct"
	"github.com/exactlyonce/dedupe/internal/pgxdriver"
	"github.com/exactlyonce/dedupe/internal/txopts"
)

// TxHandlerFunc processes one message inside tx, the transaction that also
// holds the message's claim: write the effects through tx and they commit
// together with the claim, or not at all. Return an error to roll everything
// back so that a redelivery tries again; wrap it with Permanent when retrying
// cannot help. Do not commit or roll back tx: dedupe does.
//
// TTx is the transaction type of the inbox's driver: pgx.Tx for a pgx pool
// (HandlerFunc), *sql.Tx for a database/sql handle (SQL). A handler of the
// other type is refused by its constructor with a *ConfigError.
type TxHandlerFunc[TTx, M any] func(ctx context.Context, tx TTx, msg M) error

// HandlerFunc is the handler of an inbox over pgx: it receives the claim's
// transaction as a pgx.Tx.
type HandlerFunc[M any] = TxHandlerFunc[pgx.Tx, M]

// ConsumerConfig configures a Consumer.
type ConsumerConfig[M any] struct {
	// Scope is the namespace of the keys: the consumer group, queue or
	// endpoint. Required.
	Scope string
	// Key extracts the message's dedup key: an id that every redelivery of
	// the message carries, never a per-attempt id. Required.
	Key func(msg M) (string, error)
	// Fingerprint optionally hashes the payload (see Key.Fingerprint); a
	// redelivery under the same key with another fingerprint reports
	// OutcomeConflict. Defaults to none.
	Fingerprint func(msg M) []byte
	// IsoLevel is the transaction's isolation level. Serialization failures
	// are retried. Defaults to the database default (read committed).
	IsoLevel pgx.TxIsoLevel
	// LockTimeout, when set, bounds how long a duplicate waits for a
	// concurrent transaction holding the same key; after it the duplicate is
	// reported as OutcomeInFlight instead of waiting. It is set with
	// SET LOCAL, so it bounds every lock wait of the transaction, the
	// handler's included. It is sent with BEGIN, so it costs no extra round
	// trip. Defaults to 0 (wait).
	LockTimeout time.Duration
	// MaxAttempts is how many failed attempts a message gets before its key
	// is marked failed. Defaults to the inbox's Config.MaxAttempts; negative
	// means no limit.
	MaxAttempts int
	// TxRetries is how often a transaction aborted by a serialization failure
	// or deadlock is run again before the error is returned. Defaults to 3.
	TxRetries int
	// SynchronousCommit, when set, is synchronous_commit for the claim's
	// transaction only: "remote_apply", "on", "remote_write", "local" or
	// "off". It is set with SET LOCAL and sent with BEGIN, so it costs no
	// extra round trip. With a standby named in the server's
	// synchronous_standby_names, "on" or "remote_apply" makes the COMMIT,
	// and so the ack a transport sends after it, wait until the standby has
	// the claim and its effects: a failover to that standby then loses no
	// acknowledged message, whatever the server's own default
	// (docs/reliability.md). Without synchronous_standby_names it changes
	// nothing about replication. Defaults to "" (the server's setting).
	SynchronousCommit string
	// Describe tells the inbox's Observer what a transport knows of msg
	// (subject, partition, delivery count, headers with the trace context).
	// Transport adapters set it. It is called only when the inbox has an
	// Observer, and the handler then finds its result in its context
	// (MessageInfoFrom). Defaults to none: the Observer then uses the
	// MessageInfo in the context (WithMessageInfo), if any.
	Describe func(msg M) MessageInfo
}

// Consumer runs a handler at most once per message key, with the claim and
// the handler's effects in one transaction. It is safe for concurrent use.
type Consumer[M any] struct {
	txDriver
	cfg        ConsumerConfig[M]
	handler    func(ctx context.Context, tx any, msg M) error
	unobserved bool // a BatchConsumer's fallback: the batch reports it
}

// NewConsumer returns a Consumer that runs h for each new message. h takes
// the transaction type of the inbox's driver: pgx.Tx, or *sql.Tx for an
// inbox over SQL.
func NewConsumer[M, TTx any](inbox *Inbox, cfg ConsumerConfig[M], h TxHandlerFunc[TTx, M]) (*Consumer[M], error) {
	if h == nil {
		return nil, &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	d, err := newTxDriver(inbox, &cfg)
	if err != nil {
		return nil, err
	}
	eh, err := eraseTx(inbox.drv, h)
	if err != nil {
		return nil, err
	}
	d.checkCommits()
	return &Consumer[M]{txDriver: d, cfg: cfg, handler: eh}, nil
}

// newTxDriver validates cfg, fills its defaults and returns the transaction
// driver it describes.
func newTxDriver[M any](inbox *Inbox, cfg *ConsumerConfig[M]) (txDriver, error) {
	switch {
	case inbox == nil:
		return txDriver{}, &ConfigError{Field: "inbox", Reason: "must not be nil"}
	case cfg.Key == nil:
		return txDriver{}, &ConfigError{Field: "Key", Reason: "is required"}
	case cfg.LockTimeout < 0:
		return txDriver{}, &ConfigError{Field: "LockTimeout", Reason: "must not be negative"}
	case !txopts.ValidSyncCommit(cfg.SynchronousCommit):
		return txDriver{}, &ConfigError{Field: "SynchronousCommit",
			Reason: fmt.Sprintf("%q is none of on, remote_apply, remote_write, local, off", cfg.SynchronousCommit)}
	}
	if err := validatePart("scope", cfg.Scope); err != nil {
		return txDriver{}, &ConfigError{Field: "Scope", Reason: err.Error()}
	}
	if cfg.TxRetries == 0 {
		cfg.TxRetries = 3
	}
	d := txDriver{inbox: inbox, txOpts: pgx.TxOptions{IsoLevel: cfg.IsoLevel}}
	if p, ok := inbox.drv.(*pgxdriver.Driver); ok && p.Direct() {
		d.directBegin = direct.NewBegin(d.txOpts)
	}
	switch {
	case cfg.MaxAttempts == 0:
		d.maxAttempts = inbox.cfg.maxAttemptsParam()
	case cfg.MaxAttempts > 0:
		d.maxAttempts = cfg.MaxAttempts
	}
	d.settings = txopts.Settings(cfg.LockTimeout, cfg.SynchronousCommit)
	d.syncCommit = cfg.SynchronousCommit
	return d, nil
}

// Scope returns the consumer's scope.
func (c *Consumer[M]) Scope() string { return c.cfg.Scope }

// KeyOf returns the key the consumer claims for msg, validated.
func (c *Consumer[M]) KeyOf(msg M) (Key, error) { return keyOf(&c.cfg, msg) }

func keyOf[M any](cfg *ConsumerConfig[M], msg M) (Key, error) {
	id, err := cfg.Key(msg)
	if err != nil {
		return Key{}, wrap(ErrNoKey, err)
	}
	k := Key{Scope: cfg.Scope, ID: id}
	if cfg.Fingerprint != nil {
		k.Fingerprint = cfg.Fingerprint(msg)
	}
	return k, k.Validate()
}

// Handle processes msg exactly once per key: it begins a transaction, claims
// the key, runs the handler only for a new claim, and commits claim and
// effects together. BEGIN, the claim and the read of an existing key go to
// the server in one round trip. The handler finds its *Claim with
// ClaimFromContext.
//
// It returns nil error with OutcomeClaimed (processed now) or
// OutcomeDuplicate (processed before; the handler did not run). Otherwise the
// error says why, and the outcome tells the transport what to do:
//
//   - OutcomeRetry, *HandlerError: the handler failed or panicked (a
//     *PanicError); its effects rolled back and the attempt was counted;
//     redeliver later.
//   - OutcomeRetry, ErrTxEnded (a *HandlerError): a statement of the
//     handler failed and it returned nil; its effects rolled back, nothing is
//     reported processed, the attempt was counted.
//   - OutcomePoisoned, ErrTxEnded and ErrPoisoned (a *HandlerError): the
//     handler ended its transaction itself (a COMMIT or ROLLBACK sent as a
//     statement or through Conn(), perhaps followed by BEGIN, on any
//     driver); nothing is reported processed, and the key is marked failed,
//     in a transaction of its own, so that a redelivery never runs the
//     handler again: what it wrote after the end may have committed on its
//     own, outside the claim. Over pgx the guard refuses every statement
//     sent after the end, but not the rest of the statement that ended it
//     ("ROLLBACK; INSERT ..." sent as one simple-protocol query), nor a
//     transaction the handler began and committed itself; a *sql.Tx cannot
//     be guarded at all. The COMMIT proves that the transaction still holds
//     the claim, so one ended and begun again commits nothing. (A handler
//     whose COMMIT statement committed the claim with its effects gets
//     OutcomeRetry with ErrTxEnded instead: the key is complete and the
//     redelivery a duplicate.) Once the handler ended the transaction, the
//     claim is gone: a duplicate delivered while it still runs may claim
//     the key too. Inspect shows the key failed with the cause.
//   - OutcomeRetry, context.Canceled (or the context's cause): ctx ended
//     before the COMMIT (a shutdown); nothing committed and the attempt is
//     not counted.
//   - OutcomePoisoned, ErrPoisoned: the attempts are used up or the error was
//     Permanent; the key is marked failed; stop redelivering. The handler
//     runs at most MaxAttempts times per key, however many duplicates arrive
//     at once: a failed attempt is recorded in its own transaction before
//     the claim is released, so a concurrent duplicate that waited on the
//     claim finds the attempt counted.
//   - OutcomeInFlight, ErrInFlight: a concurrent attempt holds the key;
//     redeliver later. In this transactional mode it happens only with
//     ConsumerConfig.LockTimeout set (otherwise a concurrent duplicate waits
//     for the first transaction to end and then reports OutcomeDuplicate, or
//     claims the key if the first failed), or when a leased claim of the same
//     key is live.
//   - OutcomeConflict, ErrConflict: the key was used with another payload.
//   - OutcomeUnknown, ErrOutcomeUnknown: the COMMIT was sent, its reply was
//     lost, and a fresh connection could not tell whether it committed (or
//     found the key absent more than Config.Retention after the claim, when
//     Purge may have deleted a committed claim). Never treat it as a
//     rollback; redeliver, and a committed first attempt makes the
//     redelivery a duplicate. (When the fresh connection can tell, Handle
//     reports what happened: OutcomeClaimed, or an error as below.)
//   - OutcomeNone, ErrReentrant: the handler of this very key called Handle
//     for it.
//   - OutcomeNone, ErrInvalidKey or ErrNoKey: the message has no usable key.
//   - OutcomeNone, any other error: the database failed; nothing committed.
func (c *Consumer[M]) Handle(ctx context.Context, msg M) (Outcome, error) {
	key, err := c.KeyOf(msg)
	if err != nil {
		return OutcomeNone, err
	}
	return c.HandleKey(ctx, key, msg)
}

// HandleKey is Handle for a key the caller already has from KeyOf (an
// adapter that logs or routes by it), so it is not extracted twice. key must
// be valid; KeyOf validates it.
func (c *Consumer[M]) HandleKey(ctx context.Context, key Key, msg M) (Outcome, error) {
	if err := c.inbox.reentrant(ctx, key); err != nil {
		return OutcomeNone, err
	}
	done := nopDone
	if !c.unobserved {
		ctx, done = observeMsg(ctx, c.inbox, &c.cfg, key, "transactional", msg)
	}
	for try := 0; ; try++ {
		outcome, attempt, err := c.attempt(ctx, key, msg)
		if errors.Is(err, ErrRetryable) && try < c.cfg.TxRetries && ctx.Err() == nil {
			continue
		}
		outcome, err = cancelled(ctx, key, outcome, err)
		done(outcome, attempt, err)
		return outcome, err
	}
}

// observeMsg starts observing the handling of msg with inbox's Observer, if
// it has one. The MessageInfo from cfg.Describe goes to the Observer and
// into the returned context, where the handler finds it (MessageInfoFrom);
// without Describe, the Observer uses the context's. Without an Observer it
// costs nothing, so Describe is not called.
func observeMsg[M any](ctx context.Context, inbox *Inbox, cfg *ConsumerConfig[M], key Key, mode string, msg M) (context.Context, func(Outcome, int, error)) {
	if inbox.cfg.Observer == nil {
		return ctx, nopDone
	}
	var m *MessageInfo
	if cfg.Describe != nil {
		m = new(MessageInfo)
		*m = cfg.Describe(msg)
		ctx = withMessageInfo(ctx, m)
	}
	return inbox.observe(ctx, key, mode, m)
}

// attempt runs one transaction of Handle and reports the attempt number it
// claimed (0 when it made no claim).
func (c *Consumer[M]) attempt(ctx context.Context, key Key, msg M) (Outcome, int, error) {
	var claim *Claim
	o, err := c.attemptClaim(ctx, key, msg, &claim)
	if err != nil {
		if he, ok := errors.AsType[*HandlerError](err); ok {
			return o, he.Attempt, err
		}
	}
	if claim != nil {
		return o, claim.Attempt, err
	}
	return o, 0, err
}

// attemptClaim runs one transaction of Handle, leaving its claim in *cp.
func (c *Consumer[M]) attemptClaim(ctx context.Context, key Key, msg M, cp **Claim) (Outcome, error) {
	inbox := c.inbox
	req := inbox.newClaimReq(key, StateComplete, c.maxAttempts)
	sent := time.Now()
	tx, round, savepoint, err := c.beginClaim(ctx, req)
	if err != nil {
		return inFlightOr(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	claim, extra, err := inbox.settle(ctx, tx, req, round, sent)
	if err != nil {
		return inFlightOr(err)
	}
	*cp = claim
	switch claim.Outcome {
	case OutcomeClaimed:
	case OutcomePoisoned:
		// The claim itself may have just marked the key failed; keep that.
		if err := tx.Commit(ctx); err != nil {
			return 0, translate(err)
		}
		return OutcomePoisoned, fmt.Errorf("%w: %s", ErrPoisoned, key)
	case OutcomeDuplicate:
		if log := inbox.cfg.Logger; log.Enabled(ctx, slog.LevelDebug) {
			log.DebugContext(ctx, "dedupe: duplicate skipped", "scope", key.Scope, "key", key.ID)
		}
		return OutcomeDuplicate, nil
	default:
		return claim.Outcome, fmt.Errorf("%w: %s", claim.Outcome.Err(), key)
	}
	if extra || !savepoint {
		// The claim was taken over after the round's savepoint, or the
		// round skipped it.
		if _, err := tx.Exec(ctx, sqlSavepoint); err != nil {
			return 0, translate(err)
		}
	}

	herr := runGuarded(tx, func() error { return c.handler(contextWithClaim(ctx, claim), tx.HandlerTx(), msg) })
	if herr != nil {
		return c.failed(ctx, tx, claim, herr)
	}
	if p := claim.pending; p != nil {
		if err := inbox.StoreResultTx(ctx, tx, claim, *p); err != nil {
			return 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		// Ended before the COMMIT: database/sql rolls the transaction back
		// on its own as its context ends, pgx refuses to send the COMMIT;
		// never a race between the two. Not an attempt (cancelled).
		return OutcomeNone, err
	}
	o, err := c.commit(ctx, tx, claim)
	if errors.Is(err, errFailedTx) || errors.Is(err, errEndedBehind) {
		return c.failed(ctx, tx, claim, err)
	}
	return o, err
}

// cancelled reports a handling that failed without an outcome after ctx
// ended (a shutdown: database/sql rolls the transaction back when its
// context ends) as OutcomeRetry: nothing committed, and it is not an
// attempt of the message.
func cancelled(ctx context.Context, key Key, o Outcome, err error) (Outcome, error) {
	if err == nil || o != OutcomeNone || ctx.Err() == nil {
		return o, err
	}
	if errors.Is(err, ctx.Err()) {
		return OutcomeRetry, fmt.Errorf("dedupe: handling of %s cancelled; nothing committed: %w", key, bare(err))
	}
	return OutcomeRetry, fmt.Errorf("dedupe: handling of %s cancelled (%w); nothing committed: %w", key, context.Cause(ctx), bare(err))
}

type claimCtxKey struct{}

// contextWithClaim returns ctx carrying c, for the handler of the claim.
func contextWithClaim(ctx context.Context, c *Claim) context.Context {
	return context.WithValue(ctx, claimCtxKey{}, c)
}

// ClaimFromContext returns the claim of the message being handled, or nil
// outside a handler. Use it for Claim.DerivedKey and Claim.SetResult.
func ClaimFromContext(ctx context.Context) *Claim {
	c, _ := ctx.Value(claimCtxKey{}).(*Claim)
	return c
}
