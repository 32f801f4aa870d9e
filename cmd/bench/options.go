package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe/internal/scratch"
)

// options are the benchmark's flags.
type options struct {
	dsn         string
	workers     []int
	duration    time.Duration
	warmup      time.Duration
	batch       int
	inboxRows   []int64
	sizeWorkers int
	purge       bool
	markdown    bool
	maxConns    int
	only        []string
	transports  bool
	rounds      int
	// transportMsgs is how many messages each transport row drains.
	transportMsgs    int
	transportTimeout time.Duration
}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var workers, rows, only string
	fs.StringVar(&o.dsn, "dsn", "", "PostgreSQL connection string (defaults to $DATABASE_URL, else "+scratch.LocalDSN+")")
	fs.StringVar(&workers, "workers", "1,8,32", "comma-separated worker counts")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "measured time per row")
	fs.DurationVar(&o.warmup, "warmup", 200*time.Millisecond, "unmeasured warm-up per row")
	fs.IntVar(&o.batch, "batch", 100, "messages per batch of the batch scenarios")
	fs.StringVar(&rows, "inbox-rows", "1e5", "comma-separated inbox sizes to preload with generate_series (e.g. 1e5,1e6,1e7; empty: skip)")
	fs.IntVar(&o.sizeWorkers, "size-workers", 8, "workers of the inbox-size and purge measurements")
	fs.BoolVar(&o.purge, "purge", true, "measure a retention purge of -inbox-rows[0] expired keys while consumers run")
	fs.BoolVar(&o.markdown, "markdown", false, "print the report as Markdown tables")
	fs.IntVar(&o.maxConns, "max-conns", 34, "connections of the pool at most (PostgreSQL's max_connections is shared)")
	fs.StringVar(&only, "only", "", "comma-separated substrings: run only the scenarios whose name contains one")
	fs.BoolVar(&o.transports, "transports", true, "also measure the NATS and Kafka runners against hand-written consumers")
	fs.IntVar(&o.transportMsgs, "transport-msgs", 2000, "messages each transport row publishes and drains")
	fs.DurationVar(&o.transportTimeout, "transport-timeout", 5*time.Minute, "the transport section fails after this")
	fs.IntVar(&o.rounds, "rounds", 1, "repeat the main sweep this often and keep the median round per row")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.dsn = scratch.DSN(o.dsn)
	for _, w := range strings.Split(workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("-workers: %q is not a count in [1, 256]", w)
		}
		o.workers = append(o.workers, n)
	}
	for _, r := range strings.Split(rows, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		f, err := strconv.ParseFloat(r, 64)
		if err != nil || f < 1 || f > 1e9 {
			return nil, fmt.Errorf("-inbox-rows: %q is not a row count in [1, 1e9]", r)
		}
		o.inboxRows = append(o.inboxRows, int64(f))
	}
	if only != "" {
		o.only = strings.Split(only, ",")
	}
	switch {
	case o.duration <= 0:
		return nil, errors.New("-duration must be positive")
	case o.warmup < 0:
		return nil, errors.New("-warmup must not be negative")
	case o.batch < 1:
		return nil, errors.New("-batch must be at least 1")
	case o.sizeWorkers < 1:
		return nil, errors.New("-size-workers must be at least 1")
	case o.transportMsgs < 1:
		return nil, errors.New("-transport-msgs must be at least 1")
	case o.rounds < 1:
		return nil, errors.New("-rounds must be at least 1")
	case o.maxConns < 2:
		return nil, errors.New("-max-conns must be at least 2")
	}
	return o, nil
}

// selected reports whether the scenario name passes -only.
func (o *options) selected(name string) bool {
	return len(o.only) == 0 || slices.ContainsFunc(o.only, func(s string) bool {
		return s != "" && strings.Contains(strings.ToLower(name), strings.ToLower(strings.TrimSpace(s)))
	})
}
