// Package pgerr classifies the errors of any PostgreSQL driver (pgx, and
// database/sql over pgx's stdlib or lib/pq) for the core and httpidem: a
// server's answer, a definite rollback, or a request whose outcome is
// unknown.
package pgerr

import (
	"database/sql"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SQLState returns the SQLSTATE of a server error, from any driver:
// *pgconn.PgError and lib/pq's *pq.Error both have the method.
func SQLState(err error) (string, bool) {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState(), true
	}
	return "", false
}

// IsTxDone reports an error of a transaction that was already ended.
func IsTxDone(err error) bool {
	return errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, sql.ErrTxDone)
}

// IsFailedTxCommit reports a COMMIT refused because the transaction had
// failed, a definite rollback: pgx (and its stdlib) say
// pgx.ErrTxCommitRollback, lib/pq its ErrInFailedTransaction, known by its
// text in either case of its versions (nothing here depends on lib/pq).
func IsFailedTxCommit(err error) bool {
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return true
	}
	for ; err != nil; err = errors.Unwrap(err) {
		if strings.EqualFold(err.Error(), "pq: could not complete operation in a failed transaction") {
			return true
		}
	}
	return false
}

// MayHaveApplied reports whether a statement (a COMMIT above all) that
// failed with err may still have taken effect: not when the server
// answered, the transaction was already over or refused the COMMIT, or pgx
// knows the request never left. database/sql drivers say driver.ErrBadConn
// both for a request that never left and (lib/pq) for a connection that
// broke under a COMMIT, so only pgx's word is taken.
//
// A FATAL error on an open connection is not such an answer: the server
// says it ends the connection, and a backend terminated right after it
// answered a COMMIT (pg_terminate_backend, a fast shutdown) sends the
// COMMIT's CommandComplete, then the FATAL error in place of ReadyForQuery;
// pgx reports that error for the COMMIT that applied.
func MayHaveApplied(err error) bool {
	if err == nil {
		return false
	}
	if IsFatal(err) {
		return true
	}
	if _, ok := SQLState(err); ok || IsTxDone(err) || IsFailedTxCommit(err) {
		return false
	}
	return !pgconn.SafeToRetry(err)
}

// IsFatal reports a server error of severity FATAL or PANIC that pgx (or
// its stdlib) received on an established connection: the server ended the
// connection. An error while connecting (*pgconn.ConnectError) is not one:
// nothing was sent. lib/pq is not asked: it turns a FATAL error on an open
// connection into driver.ErrBadConn (already an outcome that may have
// applied), and returns its *pq.Error with severity FATAL only when the
// server refused a new connection (an unknown database, too many clients,
// a server starting or stopping), where nothing was sent.
func IsFatal(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return false
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	sev := pe.SeverityUnlocalized
	if sev == "" {
		sev = pe.Severity
	}
	return sev == "FATAL" || sev == "PANIC"
}
