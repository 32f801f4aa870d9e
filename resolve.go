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
// mistaken for a rollback. When the database cannot answer in that time the
// error matches ErrOutcomeUnknown: then nothing may be assumed either way.
func (i *Inbox) Resolve(ctx context.Context, c *Claim) (committed bool, err error) {
	if err := mustHold(c, "Resolve"); err != nil {
		return false, err
	}
	state, ours, err := i.probe(ctx, c.Key, c.Token)
	if err != nil {
		return false, &OutcomeUnknownError{Op: "commit", Key: c.Key, Err: err}
	}
	return ours && state == StateComplete, nil
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

// retryableConnErr reports an error of the connection rather than of the
// statement: worth another try on a fresh connection.
func retryableConnErr(err error) bool {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		code := pgErr.SQLState()
		// 57P01 admin shutdown (a terminated backend), 08xxx connection
		// exceptions, 53300 too many connections.
		return code == "57P01" || code == "53300" || (len(code) == 5 && code[:2] == "08")
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}
