package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe"
)

// keyFlags are the --scope and --key flags of inspect, release and run.
type keyFlags struct{ scope, key string }

func (k *keyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.scope, "scope", "", "`scope` of the key: the consumer group, endpoint or tenant. Required.")
	fs.StringVar(&k.key, "key", "", "the `key` within the scope. Required.")
}

// inspectFlags are the flags of inspect: one key, or a list by prefix.
type inspectFlags struct {
	keyFlags
	prefix, state string
	limit         int
}

func inspectCommand() *command {
	return &command{
		name:     "inspect",
		synopsis: "inspect --scope S (--key K | --prefix P [--state failed] [--limit N])",
		summary:  "show one key (state, attempts, lease, stored result, last error), or list keys by prefix",
		about: `inspect prints the stored row of one key: its state (in_flight, complete,
failed), the number of attempts, the lease (live, expired, or released by a
failed attempt, which leaves the key in_flight for the next attempt), the stored
result (status, headers, body) and the last error. It exits 3 when the key is
absent.

With --prefix instead of --key it lists the scope's keys that start with P
(in --state, when given), one a line with state, attempts and last error: the
messages an adapter refused are recorded failed under dedupekafka-refused/,
dedupenats-refused/ or deduperedis-refused/. --state without --prefix lists
every key of the scope in that state. It exits 0, with an empty list too.`,
		flags: func(fs *flag.FlagSet) any {
			f := &inspectFlags{}
			f.register(fs)
			fs.StringVar(&f.prefix, "prefix", "", "list the keys that start with `prefix` instead of showing one key.")
			fs.StringVar(&f.state, "state", "", "with --prefix: list only keys in `state` (in_flight, complete or failed).")
			fs.IntVar(&f.limit, "limit", defaultListLimit, "with --prefix: list at most `n` keys.")
			return f
		},
		run: runInspect,
	}
}

// recordJSON is a stored key as inspect prints it.
type recordJSON struct {
	Scope          string              `json:"scope"`
	Key            string              `json:"key"`
	State          dedupe.State        `json:"state"`
	Attempts       int                 `json:"attempts"`
	Lease          string              `json:"lease"` // none, live, expired or released
	LockedUntil    jsonTime            `json:"locked_until"`
	LeaseRemaining string              `json:"lease_remaining,omitempty"`
	Fingerprint    string              `json:"fingerprint,omitempty"`
	ResultStatus   *int                `json:"result_status,omitempty"`
	ResultHeaders  map[string][]string `json:"result_headers,omitempty"`
	bodyFields
	LastError string   `json:"last_error,omitempty"`
	CreatedAt jsonTime `json:"created_at"`
	UpdatedAt jsonTime `json:"updated_at"`
	ExpiresAt jsonTime `json:"expires_at"`
}

// releasedGap tells a lease that a failed attempt ended from one that ran
// out. A failure (Inbox.Fail, or a transactional handler's) ends the lease
// in the statement that records it, so locked_until and updated_at are two
// readings of the database's clock in one statement, microseconds apart; a
// lease that ran out was set, at its last write, to end a whole lease later.
const releasedGap = 10 * time.Millisecond

// newRecordJSON renders r; its lease is judged on the database's clock
// (Record.ReadAt).
func newRecordJSON(r *dedupe.Record) recordJSON {
	out := recordJSON{
		Scope: r.Key.Scope, Key: r.Key.ID, State: r.State, Attempts: r.Attempts, Lease: "none",
		LastError: r.LastError, CreatedAt: jsonTime{r.CreatedAt}, UpdatedAt: jsonTime{r.UpdatedAt}, ExpiresAt: jsonTime{r.ExpiresAt},
	}
	if len(r.Key.Fingerprint) > 0 {
		out.Fingerprint = hex.EncodeToString(r.Key.Fingerprint)
	}
	if r.LockedUntil != nil {
		out.LockedUntil = jsonTime{*r.LockedUntil}
		if r.State == dedupe.StateInFlight {
			switch left := r.LockedUntil.Sub(r.ReadAt); {
			case left > 0:
				out.Lease = "live"
				out.LeaseRemaining = left.Round(time.Millisecond).String()
			case r.LockedUntil.Sub(r.UpdatedAt).Abs() < releasedGap:
				out.Lease = "released"
			default:
				out.Lease = "expired"
			}
		}
	}
	if res := r.Result; res != nil {
		st := res.Status
		out.ResultStatus = &st
		out.ResultHeaders = res.Headers
		out.bodyFields = newBodyFields(res.Body)
	}
	return out
}

// writeText renders the record for people.
func (r recordJSON) writeText(w io.Writer) {
	fmt.Fprintf(w, "scope\t%s\n", r.Scope)
	fmt.Fprintf(w, "key\t%s\n", r.Key)
	switch r.Lease {
	case "live":
		fmt.Fprintf(w, "state\t%s (held by a running attempt)\n", r.State)
	case "released":
		fmt.Fprintf(w, "state\t%s (released: no attempt holds it; the next run or delivery takes it over)\n", r.State)
	case "expired":
		fmt.Fprintf(w, "state\t%s (no attempt holds it: its holder stopped renewing; the next run or delivery takes it over)\n", r.State)
	default:
		fmt.Fprintf(w, "state\t%s\n", r.State)
	}
	fmt.Fprintf(w, "attempts\t%d\n", r.Attempts)
	switch r.Lease {
	case "live":
		fmt.Fprintf(w, "lease\tlive until %s (%s left)\n", r.LockedUntil.text(), r.LeaseRemaining)
	case "released":
		fmt.Fprintf(w, "lease\tended at %s by the failed attempt\n", r.LockedUntil.text())
	case "expired":
		fmt.Fprintf(w, "lease\texpired at %s (a retry may take the key over)\n", r.LockedUntil.text())
	default:
		fmt.Fprintf(w, "lease\tnone\n")
	}
	if r.Fingerprint != "" {
		fmt.Fprintf(w, "fingerprint\t%s\n", r.Fingerprint)
	}
	if r.ResultStatus != nil {
		fmt.Fprintf(w, "result status\t%d\n", *r.ResultStatus)
		names := make([]string, 0, len(r.ResultHeaders))
		for k := range r.ResultHeaders {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			fmt.Fprintf(w, "result header\t%s: %s\n", k, strings.Join(r.ResultHeaders[k], ", "))
		}
		switch {
		case r.Body != nil:
			fmt.Fprintf(w, "result body\t%q\n", *r.Body)
		case r.BodyBase64 != nil:
			fmt.Fprintf(w, "result body\t%d bytes, not UTF-8 (use --json)\n", len(r.BodyBase64))
		}
	}
	if r.LastError != "" {
		fmt.Fprintf(w, "last error\t%q\n", r.LastError)
	}
	fmt.Fprintf(w, "created\t%s\n", r.CreatedAt.text())
	fmt.Fprintf(w, "updated\t%s\n", r.UpdatedAt.text())
	fmt.Fprintf(w, "expires\t%s\n", r.ExpiresAt.text())
}

func runInspect(ctx context.Context, c *cli, opts any, args []string) int {
	f := opts.(*inspectFlags)
	if f.prefix != "" || f.state != "" {
		return runList(ctx, c, f, args)
	}
	kf := &f.keyFlags
	key, err := requireKey(kf.scope, kf.key)
	if err == nil {
		err = noArgs(args)
	}
	if err != nil {
		return c.fail("inspect", err)
	}
	pool, inbox, err := c.connect(ctx, dedupe.Config{})
	if err != nil {
		return c.fail("inspect", err)
	}
	defer pool.Close()
	rec, err := inbox.Lookup(ctx, key)
	if err != nil {
		return c.fail("inspect", keyNotFound(key, err))
	}
	r := newRecordJSON(rec)
	c.emit(c.stdout, r, r.writeText)
	return exitOK
}

// runList is inspect --prefix.
func runList(ctx context.Context, c *cli, f *inspectFlags, args []string) int {
	var err error
	switch {
	case f.key != "":
		err = usagef("--key shows one key; --prefix and --state list keys: give one or the other")
	case f.scope == "":
		err = usagef("--scope is required")
	case f.limit <= 0:
		err = usagef("--limit must be positive")
	case f.state != "" && f.state != string(dedupe.StateInFlight) && f.state != string(dedupe.StateComplete) && f.state != string(dedupe.StateFailed):
		err = usagef("--state must be in_flight, complete or failed, not %q", f.state)
	default:
		err = noArgs(args)
	}
	if err != nil {
		return c.fail("inspect", err)
	}
	list, err := listKeys(ctx, c, f.scope, f.prefix, f.state, f.limit)
	if err != nil {
		return c.fail("inspect", err)
	}
	c.emit(c.stdout, list, list.writeText)
	return exitOK
}
