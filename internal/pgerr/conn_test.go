package pgerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestRetryableConn: what the resolver tries again on a fresh
// connection. During a failover a multi-host connection string
// (target_session_attrs=read-write) fails with every host's error joined,
// as pgconn's ConnectError wraps them: the dying primary's 57P03 next to the
// standby's "read only connection". Both are transient within the
// resolver's bound; a real statement error anywhere in the tree is not.
func TestRetryableConn(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code} }
	// connectErr mirrors pgconn.ConnectError: one wrapped error per host,
	// joined.
	connectErr := func(hosts ...error) error {
		var errs []error
		for i, e := range hosts {
			errs = append(errs, fmt.Errorf("failed to connect to host %d: %w", i, e))
		}
		return fmt.Errorf("failed to connect: %w", errors.Join(errs...))
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection reset", io.ErrUnexpectedEOF, true},
		{"terminated backend 57P01", pg("57P01"), true},
		{"crash shutdown 57P02", pg("57P02"), true},
		{"shutting down or starting up 57P03", pg("57P03"), true},
		{"too many connections 53300", pg("53300"), true},
		{"connection failure 08006", pg("08006"), true},
		{"standby not promoted 25006", pg("25006"), true},
		{"primary shutting down, standby read only", connectErr(pg("57P03"), pgconn.ErrReadOnlyConnection), true},
		{"primary gone, standby read only", connectErr(io.EOF, pgconn.ErrReadOnlyConnection), true},
		{"primary starting up, standby refusing", connectErr(pg("57P03"), pg("57P03")), true},
		{"wrong password on one host", connectErr(pg("57P03"), pg("28P01")), false},
		{"database missing", connectErr(pg("3D000")), false},
		{"undefined table", pg("42P01"), false},
		{"lock timeout", fmt.Errorf("dedupe: key in flight: %w", pg("55P03")), false},
		{"cancelled", context.Canceled, false},
		{"deadline with a transient error", errors.Join(pg("57P03"), context.DeadlineExceeded), false},
	} {
		if got := RetryableConn(tc.err); got != tc.want {
			t.Errorf("%s: RetryableConn(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
