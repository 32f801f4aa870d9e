package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/dedupe/internal/scratch"
)

// options are the benchmark's flags.
type options struct {
	dsn      string
	workers  []int
	duration time.Duration // measured time of one side in one round
	warmup   time.Duration
	rounds   int
	batch    int
	// probeOps is how many operations the sequential probe of round trips
	// and allocations runs per side.
	probeOps int
	// dupKeys is how many committed keys the duplicate rows cycle through.
	dupKeys     int
	inboxRows   []int64
	sizeWorkers int
	purgeRows   int64
	markdown    bool
	maxConns    int
	only        []string
	transports  bool
	timeout     time.Duration
	quiesceWait time.Duration // the wait for autovacuum before a row, at most
	checkpoint  bool          // a CHECKPOINT before each row
	backlogRate float64       // expected transport throughput for the backlogs (0: each row's own)
	txCPU       int           // transactions of each shape in the server-CPU section (0: none)
}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var workers, rows, purgeRows, only string
	fs.StringVar(&o.dsn, "database-url", "", "PostgreSQL on this machine (loopback or a Unix socket; defaults to $DATABASE_URL, else "+scratch.LocalDSN+")")
	fs.StringVar(&o.dsn, "dsn", "", "deprecated: the old name of -database-url, still accepted")
	fs.StringVar(&workers, "workers", "1,8,32", "comma-separated worker counts (JetStream workers, Kafka partitions, relays in the transport rows)")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "measured time of each side in each round (two windows of half of it)")
	fs.DurationVar(&o.warmup, "warmup", 200*time.Millisecond, "unmeasured warm-up before each measured run")
	fs.IntVar(&o.rounds, "rounds", 4, "interleaved rounds per row, an even number: each side runs -duration per round in two windows, A B B A, each side A in half of the rounds")
	fs.IntVar(&o.batch, "batch", 100, "messages per batch of the batch rows")
	fs.IntVar(&o.probeOps, "probe-ops", 300, "operations of the sequential probe that counts round trips and allocations per message")
	fs.IntVar(&o.dupKeys, "dup-keys", 10000, "committed keys the duplicate and replay rows cycle through")
	fs.StringVar(&rows, "inbox-rows", "1e5", "comma-separated inbox sizes to preload with generate_series for the inbox-size rows (e.g. 1e5,1e6,1e7; empty: skip)")
	fs.IntVar(&o.sizeWorkers, "size-workers", 8, "workers of the inbox-size and purge rows")
	fs.StringVar(&purgeRows, "purge-rows", "1e5", "expired keys Inbox.Purge deletes in the purge rows (0: skip)")
	fs.IntVar(&o.txCPU, "tx-cpu", 2000, "transactions of each shape the server-CPU section runs on one backend, interleaved, to price the inbox row (0: skip)")
	fs.BoolVar(&o.markdown, "markdown", false, "print the report as Markdown tables")
	fs.IntVar(&o.maxConns, "max-conns", 34, "connections of the pool at most (PostgreSQL's max_connections is shared; the database/sql rows open as many again)")
	fs.StringVar(&only, "only", "", "comma-separated substrings: run only the rows whose name contains one")
	fs.BoolVar(&o.transports, "transports", true, "also measure the NATS and Kafka runners and the outbox relay (in-process brokers)")
	fs.DurationVar(&o.timeout, "timeout", time.Hour, "the whole run stops with an error after this")
	fs.DurationVar(&o.quiesceWait, "quiesce-wait", 60*time.Second, "before each row, wait this long at most for autovacuum workers to finish (after a CHECKPOINT)")
	fs.BoolVar(&o.checkpoint, "checkpoint", true, "run a CHECKPOINT before each row (off: a tiny run on a shared server, where it would only slow the others)")
	fs.Float64Var(&o.backlogRate, "backlog-rate", 0, "expected transport throughput in msgs/s that sizes the transport rows' backlogs, in place of each row's own ceiling (0: the ceiling; a tiny run needs far fewer)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.dsn = scratch.DSN(o.dsn)
	if err := loopbackOnly(o.dsn); err != nil {
		return nil, err
	}
	for _, w := range strings.Split(workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("-workers: %q is not a count in [1, 256]", w)
		}
		o.workers = append(o.workers, n)
	}
	var err error
	if o.inboxRows, err = counts("-inbox-rows", rows, 1); err != nil {
		return nil, err
	}
	pr, err := counts("-purge-rows", purgeRows, 0)
	if err != nil {
		return nil, err
	}
	for _, n := range pr {
		o.purgeRows = n
	}
	if only != "" {
		o.only = strings.Split(only, ",")
	}
	switch {
	case o.duration <= 0:
		return nil, errors.New("-duration must be positive")
	case o.warmup < 0:
		return nil, errors.New("-warmup must not be negative")
	case o.quiesceWait < 0:
		return nil, errors.New("-quiesce-wait must not be negative")
	case o.backlogRate < 0:
		return nil, errors.New("-backlog-rate must not be negative")
	case o.rounds < 2 || o.rounds%2 != 0:
		// In A B B A, A's windows each follow the other side's and B's
		// follow each other: whatever a side leaves behind for its next
		// window (its dead rows, its cached pages) weighs differently on A
		// and B, so each side must be A as often as B.
		return nil, errors.New("-rounds must be even (at least 2): each side is A in A B B A in half of the rounds")
	case o.batch < 1:
		return nil, errors.New("-batch must be at least 1")
	case o.txCPU < 0:
		return nil, errors.New("-tx-cpu must not be negative")
	case o.probeOps < 1:
		return nil, errors.New("-probe-ops must be at least 1")
	case o.dupKeys < 1:
		return nil, errors.New("-dup-keys must be at least 1")
	case o.sizeWorkers < 1:
		return nil, errors.New("-size-workers must be at least 1")
	case o.maxConns < 2:
		return nil, errors.New("-max-conns must be at least 2")
	case o.timeout <= 0:
		return nil, errors.New("-timeout must be positive")
	}
	return o, nil
}

// counts parses a comma-separated list of row counts such as "1e5,1e6".
func counts(flagName, s string, least float64) ([]int64, error) {
	var out []int64
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		f, err := strconv.ParseFloat(r, 64)
		if err != nil || f < least || f > 1e9 {
			return nil, fmt.Errorf("%s: %q is not a row count in [%v, 1e9]", flagName, r, least)
		}
		out = append(out, int64(f))
	}
	return out, nil
}

// loopbackOnly refuses a server that is not on this machine: the benchmark
// writes at full speed for minutes, which no shared or remote server should
// take by accident, and its figures are about the library, not a network.
func loopbackOnly(dsn string) error {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("-database-url: %w", err)
	}
	hosts := []string{cfg.Host}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	for _, h := range hosts {
		if !isLoopback(h) {
			return fmt.Errorf("-database-url: host %q is not this machine: the benchmark only targets a server on loopback or a Unix socket", h)
		}
	}
	return nil
}

func isLoopback(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// selected reports whether the row name passes -only.
func (o *options) selected(name string) bool {
	return len(o.only) == 0 || slices.ContainsFunc(o.only, func(s string) bool {
		return s != "" && strings.Contains(strings.ToLower(name), strings.ToLower(strings.TrimSpace(s)))
	})
}
