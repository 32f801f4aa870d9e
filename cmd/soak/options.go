package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe/internal/scratch"
)

// options are the soak's flags.
type options struct {
	n          int
	dup        float64
	transports []string
	workers    int
	dsn        string
	seed       uint64
	rates      [numFaults]float64
	terminate  int
	kills      int
	lease      time.Duration
	redelivery time.Duration
	restart    int
	idle       time.Duration

	// Inputs designed to fail, and the attempt limits.
	poison         float64
	keyless        float64
	maxAttempts    int
	poisonAttempts int
	poisonCopies   int

	// The starved transport.
	starvedConns int
	starvedLease time.Duration
	slow         time.Duration

	timeout time.Duration
	keep    bool
	verbose bool
}

// parseOptions parses the command line; every flag has a default.
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var transports string
	fs.IntVar(&o.n, "n", 20000, "messages to deliver per transport, duplicates included")
	fs.Float64Var(&o.dup, "dup", 0.2, "fraction of the inputs that repeat an earlier key (half of them close enough to run concurrently)")
	fs.StringVar(&transports, "transports", strings.Join(defaultTransports(), ","),
		"comma-separated transports to soak, of: "+strings.Join(knownTransports(), ", "))
	fs.IntVar(&o.workers, "workers", 4, "concurrent in-process consumers per transport")
	fs.StringVar(&o.dsn, "database-url", "", "PostgreSQL connection URL (defaults to $DATABASE_URL, else "+scratch.LocalDSN+")")
	fs.StringVar(&o.dsn, "dsn", "", "deprecated: the old name of -database-url, still accepted")
	fs.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "random seed (printed, so a failing run can be repeated)")
	fs.Float64Var(&o.rates[faultError], "error-rate", 0.03, "probability that a handler returns an error after writing its effect")
	fs.Float64Var(&o.rates[faultPanic], "panic-rate", 0.01, "probability that a handler panics after writing its effect")
	fs.Float64Var(&o.rates[faultRedeliver], "redeliver-rate", 0.03, "probability that the broker delivers an acknowledged message again")
	fs.Float64Var(&o.rates[faultKill], "kill-rate", 0.02, "probability, per transaction of the worker subprocess, that it is killed with SIGKILL inside it")
	fs.Float64Var(&o.rates[faultAbandon], "abandon-rate", 0.01, "leased transport: probability that a holder dies after its claim (the lease must expire)")
	fs.Float64Var(&o.rates[faultLate], "late-rate", 0.005, "leased transport: probability that a holder outlives its lease and completes late")
	fs.Float64Var(&o.rates[faultCommitLost], "drop-commit-rate", 0.02, "probability that the PostgreSQL proxy between the consumers and the database drops the reply to a COMMIT after the server applied it")
	fs.Float64Var(&o.rates[faultReplyLost], "drop-reply-rate", 0.002, "probability that the proxy drops the reply to any other statement after the server applied it")
	fs.Float64Var(&o.rates[faultCut], "cut-rate", 0.002, "probability that the proxy cuts the connection before a statement (COMMIT included) reaches the server")
	fs.Float64Var(&o.poison, "poison", 0.02, "fraction of the unique inputs designed to fail (ids f-…): their handler always fails, so they must end failed in the inbox or dead-lettered, never committed and never lost ("+strings.Join(transportsWith(func(t transport) bool { return t.poison }), ", ")+")")
	fs.Float64Var(&o.keyless, "keyless", 0.01, "fraction of the unique inputs published without a key (ids k-…): they must be dead-lettered ("+strings.Join(transportsWith(func(t transport) bool { return t.keyless }), ", ")+"; elsewhere they are ordinary inputs)")
	fs.IntVar(&o.maxAttempts, "max-attempts", 10, "attempt limit of the transports with inputs designed to fail (high enough that random faults never exhaust it)")
	fs.IntVar(&o.poisonAttempts, "poison-attempts", 3, "attempt limit of the poison transport")
	fs.IntVar(&o.poisonCopies, "poison-copies", 8, "poison transport: copies of each input designed to fail, delivered at once")
	fs.IntVar(&o.starvedConns, "starved-conns", 2, "starved transport: connections in its consumers' pool")
	fs.DurationVar(&o.starvedLease, "starved-lease", 100*time.Millisecond, "starved transport: its lease")
	fs.DurationVar(&o.slow, "slow", 10*time.Millisecond, "starved transport: how long its handler holds its transaction (and connection)")
	fs.IntVar(&o.terminate, "terminate-every", 40, "pg_terminate_backend one of the consumers' connections every this many committed effects (0: never)")
	fs.IntVar(&o.kills, "kills", 5, "SIGKILLs of the worker subprocess per transport at most (0: no subprocess)")
	fs.DurationVar(&o.lease, "lease", 300*time.Millisecond, "lease of the leased transport")
	fs.DurationVar(&o.redelivery, "redelivery", 20*time.Millisecond, "delay before a nacked message is delivered again")
	fs.IntVar(&o.restart, "restart-every", 150, "NATS, Kafka, webhook, httpidem, outbox: stop and restart an in-process consumer after about this many committed effects (0: never)")
	fs.DurationVar(&o.idle, "idle", time.Minute, "a transport's run fails when it commits no effect and acknowledges no delivery for this long")
	fs.DurationVar(&o.timeout, "timeout", 0, "the whole soak stops after this and fails (0: no limit; -idle catches a stuck run)")
	fs.BoolVar(&o.keep, "keep", false, "keep the soak's schema for inspection instead of dropping it")
	fs.BoolVar(&o.verbose, "v", false, "log the consumers' warnings and the faults")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.dsn = scratch.DSN(o.dsn)
	for _, t := range strings.Split(transports, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			continue
		}
		if !slices.Contains(knownTransports(), t) {
			return nil, fmt.Errorf("unknown transport %q (known: %s)", t, strings.Join(knownTransports(), ", "))
		}
		o.transports = append(o.transports, t)
	}
	switch {
	case len(o.transports) == 0:
		return nil, errors.New("no transport selected")
	case o.n < 1:
		return nil, errors.New("-n must be at least 1")
	case o.dup < 0 || o.dup >= 1:
		return nil, errors.New("-dup must be in [0, 1)")
	case o.workers < 1:
		return nil, errors.New("-workers must be at least 1")
	case o.timeout < 0:
		return nil, errors.New("-timeout must not be negative")
	case o.idle <= 0:
		return nil, errors.New("-idle must be positive")
	case o.terminate < 0 || o.restart < 0:
		return nil, errors.New("-terminate-every and -restart-every must not be negative")
	case o.lease <= 0 || o.starvedLease <= 0:
		return nil, errors.New("-lease and -starved-lease must be positive")
	case o.poison < 0 || o.keyless < 0 || o.poison+o.keyless > 0.5:
		return nil, errors.New("-poison and -keyless must not be negative and add up to at most 0.5")
	case o.maxAttempts < 1 || o.poisonAttempts < 1:
		return nil, errors.New("-max-attempts and -poison-attempts must be at least 1")
	case o.poisonCopies < 1:
		return nil, errors.New("-poison-copies must be at least 1")
	case o.starvedConns < 1:
		return nil, errors.New("-starved-conns must be at least 1")
	case o.slow < 0:
		return nil, errors.New("-slow must not be negative")
	}
	for k, name := range rateFlags {
		if r := o.rates[k]; r < 0 || r > 0.5 {
			return nil, fmt.Errorf("-%s must be in [0, 0.5]", name)
		}
	}
	return o, nil
}
