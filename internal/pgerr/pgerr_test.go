package pgerr

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pqError has lib/pq's *pq.Error method set, without depending on lib/pq.
type pqError struct{ code string }

func (e *pqError) Error() string    { return "pq: " + e.code }
func (e *pqError) SQLState() string { return e.code }

func TestMayHaveApplied(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"pgx server error", fmt.Errorf("commit: %w", &pgconn.PgError{Code: "40001"}), false},
		{"lib/pq server error", &pqError{"40P01"}, false},
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
	if code, ok := SQLState(fmt.Errorf("w: %w", &pqError{"55P03"})); !ok || code != "55P03" {
		t.Errorf("SQLState of a wrapped lib/pq error = %q, %v", code, ok)
	}
}
