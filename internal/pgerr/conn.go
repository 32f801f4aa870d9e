package pgerr

import (
	"context"
	"errors"
)

// RetryableConn reports an error of the connection, or of a server that
// cannot serve the probe yet, rather than of the statement: worth another try
// on a fresh connection, within the resolver's bound (the root's Inbox.Resolve). During a failover the old
// primary refuses connections while it shuts down and the standby is read
// only until it is promoted; a multi-host connection string
// (target_session_attrs=read-write) reports every host's error joined, so
// every server error in err's tree must be transient.
func RetryableConn(err error) bool {
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
