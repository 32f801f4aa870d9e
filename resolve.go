package dedupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

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
		if errors.Is(err, ErrInFlight) || !retryableConnErr(err) {
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
	tx, err := i.drv.begin(ctx, opts, nil)
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

// retryableConnErr reports an error of the connection, or of a server that
// cannot serve the probe yet, rather than of the statement: worth another try
// on a fresh connection, within resolveTimeout. During a failover the old
// primary refuses connections while it shuts down and the standby is read
// only until it is promoted; a multi-host connection string
// (target_session_attrs=read-write) reports every host's error joined, so
// every server error in err's tree must be transient.
func retryableConnErr(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	retry := true
	walkErrors(err, func(e error) {
		if se, ok := e.(interface{ SQLState() string }); ok && !transientState(se.SQLState()) {
			retry = false
		}
	})
	return retry
}

// transientState reports a SQLSTATE that a fresh connection may not meet:
// 57P01 admin shutdown (a terminated backend), 57P02 crash shutdown (a
// backend ended by another's crash), 57P03 cannot connect now (a server
// starting up or shutting down), 53300 too many connections, 25006 read-only
// transaction (a standby not promoted yet) and 08xxx connection exceptions.
func transientState(code string) bool {
	switch code {
	case "57P01", "57P02", "57P03", "53300", "25006":
		return true
	}
	return len(code) == 5 && code[:2] == "08"
}

// walkErrors calls f for err and every error it wraps, through
// errors.Join's and fmt.Errorf's lists too.
func walkErrors(err error, f func(error)) {
	if err == nil {
		return
	}
	f(err)
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		walkErrors(u.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			walkErrors(e, f)
		}
	}
}
