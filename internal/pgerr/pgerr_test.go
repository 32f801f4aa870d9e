package pgerr

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// pqError has lib/pq's *pq.Error method set, without depending on lib/pq.
type pqError struct {
	code  string
	fatal bool
}

func (e *pqError) Error() string    { return "pq: " + e.code }
func (e *pqError) SQLState() string { return e.code }
func (e *pqError) Fatal() bool      { return e.fatal }

func TestMayHaveApplied(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"pgx server error", fmt.Errorf("commit: %w", &pgconn.PgError{Code: "40001"}), false},
		{"lib/pq server error", &pqError{code: "40P01"}, false},
		{"pgx FATAL: the connection ended, maybe after the COMMIT applied", fmt.Errorf("commit: %w", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}), true},
		{"pgx FATAL, localized severity only", &pgconn.PgError{Severity: "FATAL", Code: "57P02"}, true},
		{"pgx PANIC", &pgconn.PgError{Severity: "PANIC", SeverityUnlocalized: "PANIC", Code: "XX000"}, true},
		{"pgx localized FATAL text with an ERROR severity", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "ERROR", Code: "40001"}, false},
		{"lib/pq FATAL: only a refused connection (an open one's is driver.ErrBadConn)", &pqError{code: "53300", fatal: true}, false},
		{"pgx rolled back", pgx.ErrTxCommitRollback, false},
		{"lib/pq rolled back (v1.12)", errors.New("pq: could not complete operation in a failed transaction"), false},
		{"lib/pq rolled back (older)", fmt.Errorf("x: %w", errors.New("pq: Could not complete operation in a failed transaction")), false},
		{"tx already over (pgx)", pgx.ErrTxClosed, false},
		{"tx already over (database/sql)", sql.ErrTxDone, false},
		{"connection broke under the request", io.ErrUnexpectedEOF, true},
		{"context ended", context.Canceled, true},
	} {
		if got := MayHaveApplied(tc.err); got != tc.want {
			t.Errorf("%s: MayHaveApplied(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	if code, ok := SQLState(fmt.Errorf("w: %w", &pqError{code: "55P03"})); !ok || code != "55P03" {
		t.Errorf("SQLState of a wrapped lib/pq error = %q, %v", code, ok)
	}
}

// TestFatalWhileConnectingIsNotAnOutcome: a FATAL answer to a connection
// attempt (here an unknown database) comes before anything was sent: it is
// no FATAL on an open connection, and says nothing applied.
func TestFatalWhileConnectingIsNotAnOutcome(t *testing.T) {
	u, err := url.Parse(dbtest.BaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/dedupe_no_such_database"
	_, err = pgconn.Connect(context.Background(), u.String())
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.SeverityUnlocalized != "FATAL" {
		t.Fatalf("connect to an unknown database = %v, want a FATAL server error", err)
	}
	if IsFatal(err) || MayHaveApplied(err) {
		t.Errorf("IsFatal, MayHaveApplied of a connect error = %v, %v; want false, false", IsFatal(err), MayHaveApplied(err))
	}
}
