package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/internal/scratch"
)

// report is everything one run measured.
type report struct {
	opts  *options
	rows  []*compared // core and transport rows, in order
	costs []*costs
	sizes []*compared
	// purgeAlone are the times of Inbox.Purge with nothing else running;
	// purgeLoaded the times of the purges the purge row ran under load.
	purge                   *compared
	purgeAlone, purgeLoaded []time.Duration
	purgeAloneCPU           []time.Duration // PostgreSQL CPU of each purge alone
	txCPU                   []*txCPUResult  // the server-CPU section, when -tx-cpu > 0
	server                  string
	cores                   int
	started                 time.Time
}

// runAll sets up a private schema, measures every section and drops the
// schema.
func runAll(ctx context.Context, o *options, log io.Writer) (*report, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	schema := scratch.Name("bench")
	maxW := o.sizeWorkers
	for _, w := range o.workers {
		maxW = max(maxW, w)
	}
	cfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return nil, fmt.Errorf("parse dsn: %w", err)
	}
	cfg.MaxConns = int32(min(maxW+2, o.maxConns))
	cfg.MinConns = cfg.MaxConns
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = "dedupe-bench"
	admin, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := scratch.Create(ctx, admin, schema); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := scratch.Drop(dctx, admin, schema); err != nil {
			fmt.Fprintf(log, "bench: drop schema %s: %v\n", schema, err)
		}
	}()
	// The connection that finds the pool's backends for their CPU times.
	mcfg := cfg.ConnConfig.Copy()
	mcfg.RuntimeParams["application_name"] = "dedupe-bench-meter"
	mconn, err := pgx.ConnectConfig(ctx, mcfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer mconn.Close(context.WithoutCancel(ctx))
	pg := &pgCPU{conn: mconn, app: cfg.ConnConfig.RuntimeParams["application_name"]}
	var w wire
	dial := cfg.ConnConfig.DialFunc
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext
	}
	cfg.ConnConfig.DialFunc = w.dialFunc(dial)
	// No liveness ping when a connection idled over a second (pgxpool's
	// default): a stall of the machine would add one to either side's
	// counted round trips. The loopback server does not go away unseen.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, sqlCreateEffects); err != nil {
		return nil, err
	}
	rep := &report{opts: o, started: time.Now(), cores: runtime.NumCPU()}
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&rep.server)
	b, err := newBench(o, pool, meter{wire: &w, pg: pg})
	if err != nil {
		return nil, err
	}
	b.connConfig = cfg.ConnConfig
	defer b.closeSQL()
	if b.http, err = newHTTPBench(ctx, pool, min(o.dupKeys, 2000)); err != nil {
		return nil, err
	}
	// A section that fails ends the run; the rows measured before it are
	// still reported.
	if err := rep.runComparisons(ctx, b, sectionCore, log); err != nil {
		return rep, &partialError{err}
	}
	if err := rep.runTxCPU(ctx, cfg, log); err != nil {
		return rep, &partialError{err}
	}
	if err := rep.runSizes(ctx, b, log); err != nil {
		return rep, &partialError{err}
	}
	if err := rep.runPurge(ctx, b, log); err != nil {
		return rep, &partialError{err}
	}
	if o.transports && slices.ContainsFunc(comparisons, func(c comparison) bool { return c.section == sectionTransport && c.selected(o) }) {
		embedded, err := natstest.Embed()
		if err != nil {
			return rep, &partialError{err}
		}
		defer embedded.Close()
		b.js = embedded.JS
		if err := rep.runComparisons(ctx, b, sectionTransport, log); err != nil {
			return rep, &partialError{err}
		}
	}
	return rep, nil
}

// partialError is a measurement that failed after others succeeded: the
// report holds the rows measured before it.
type partialError struct{ err error }

func (e *partialError) Error() string { return e.err.Error() }
func (e *partialError) Unwrap() error { return e.err }

// sizeTable is the inbox the inbox-size rows preload.
const sizeTable = "bench_inbox_big"

// runSizes measures Consumer.Handle on an inbox preloaded with each of
// -inbox-rows keys against Consumer.Handle on an empty inbox, in
// interleaved rounds.
func (rep *report) runSizes(ctx context.Context, b *bench, log io.Writer) error {
	o := rep.opts
	const name = "Consumer.Handle by inbox size"
	if len(o.inboxRows) == 0 || !o.selected(name) {
		return nil
	}
	if err := dedupe.Migrate(ctx, b.pool, dedupe.MigrateConfig{InboxTable: sizeTable, Lines: []dedupe.Line{dedupe.LineInbox}}); err != nil {
		return err
	}
	big, err := dedupe.New(b.pool, dedupe.Config{Table: sizeTable})
	if err != nil {
		return err
	}
	cBig, err := dedupe.NewConsumer(big, dedupe.ConsumerConfig[string]{
		Scope: benchScope,
		Key:   func(id string) (string, error) { return id, nil },
	}, func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, sqlEffect, id, body)
		return err
	})
	if err != nil {
		return err
	}
	bigOp := func(ctx context.Context, _ int) (int, error) {
		outcome, err := cBig.Handle(ctx, b.nextID())
		if err == nil && outcome != dedupe.OutcomeClaimed {
			err = fmt.Errorf("bench: outcome %s for a new key", outcome)
		}
		return 1, err
	}
	for _, n := range o.inboxRows {
		if err := truncate(ctx, b.pool, "TRUNCATE "+sizeTable); err != nil {
			return err
		}
		start := time.Now()
		if _, err := b.pool.Exec(ctx, fmt.Sprintf(sqlPreloadHistory, sizeTable), n, time.Now().Add(dedupe.DefaultRetention)); err != nil {
			return fmt.Errorf("preload %d rows: %w", n, err)
		}
		if _, err := b.pool.Exec(ctx, "ANALYZE "+sizeTable); err != nil {
			return err
		}
		fmt.Fprintf(log, "bench: preloaded %d inbox rows in %v\n", n, time.Since(start).Round(time.Millisecond))
		c := &comparison{name: fmt.Sprint(n), unit: perMsg,
			lib:  side{name: fmt.Sprintf("Consumer.Handle, inbox of %d rows", n), op: func(*bench) op { return bigOp }},
			hand: side{name: "Consumer.Handle, empty inbox", op: func(b *bench) op { return b.opHandle }},
		}
		row, err := rep.interleave(ctx, c, o.sizeWorkers, true, log, func(s *side, round int, d time.Duration) (*sample, error) {
			if err := b.reset(ctx, fmt.Sprintf("s%d-%d", b.seq.Add(1), round)); err != nil {
				return nil, err
			}
			return measure(ctx, b.meter, o.sizeWorkers, o.warmup, d, s.op(b))
		})
		if err != nil {
			return fmt.Errorf("inbox of %d rows: %w", n, err)
		}
		rep.sizes = append(rep.sizes, row)
	}
	_, err = b.pool.Exec(ctx, "DROP TABLE "+sizeTable)
	return err
}

// runPurge times Inbox.Purge of -purge-rows expired keys on its own, and
// measures Consumer.Handle while such a purge runs (over the purge's own
// duration) against Consumer.Handle with the same expired keys present and
// no purge, in interleaved rounds.
func (rep *report) runPurge(ctx context.Context, b *bench, log io.Writer) error {
	o := rep.opts
	n := o.purgeRows
	if n == 0 || !o.selected("Inbox.Purge") {
		return nil
	}
	expired := func(round int) error {
		if err := b.reset(ctx, fmt.Sprintf("p%d-%d", b.seq.Add(1), round)); err != nil {
			return err
		}
		if _, err := b.pool.Exec(ctx, fmt.Sprintf(sqlPreloadHistory, "dedupe_inbox"), n, time.Now().Add(-time.Hour)); err != nil {
			return err
		}
		_, err := b.pool.Exec(ctx, "ANALYZE dedupe_inbox")
		return err
	}
	purge := func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		got, err := b.inbox.Purge(ctx, 0)
		took := time.Since(start)
		if err == nil && got != n {
			err = fmt.Errorf("purged %d of %d expired keys", got, n)
		}
		return took, err
	}
	for round := range o.rounds {
		if err := expired(round); err != nil {
			return err
		}
		r0 := b.meter.read()
		took, err := purge(ctx)
		if err != nil {
			return err
		}
		if u := b.meter.read().since(r0); u.pgOK {
			rep.purgeAloneCPU = append(rep.purgeAloneCPU, time.Duration(u.pgTicks)*(time.Second/clockTicks))
		}
		rep.purgeAlone = append(rep.purgeAlone, took)
		fmt.Fprintf(log, "bench: Inbox.Purge of %d expired keys, nothing else running: %v\n", n, took.Round(time.Millisecond))
	}
	c := &comparison{name: fmt.Sprintf("Consumer.Handle while Inbox.Purge deletes %d expired keys", n), unit: perMsg,
		lib:  side{name: "Consumer.Handle while Inbox.Purge runs", op: func(b *bench) op { return b.opHandle }},
		hand: side{name: "Consumer.Handle, no purge", op: func(b *bench) op { return b.opHandle }},
	}
	row, err := rep.interleave(ctx, c, o.sizeWorkers, false, log, func(s *side, round int, d time.Duration) (*sample, error) {
		if err := expired(round); err != nil {
			return nil, err
		}
		if s == &c.hand {
			return measure(ctx, b.meter, o.sizeWorkers, o.warmup, d, s.op(b))
		}
		var took time.Duration
		smp, err := measureDuring(ctx, b.meter, o.sizeWorkers, o.warmup, s.op(b), func(ctx context.Context) error {
			var err error
			took, err = purge(ctx)
			return err
		})
		rep.purgeLoaded = append(rep.purgeLoaded, took)
		return smp, err
	})
	if err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	rep.purge = row
	return nil
}

// measureDuring is measure with a window that lasts as long as during runs:
// the throughput of the workers while something else (a purge) loads the
// database.
func measureDuring(ctx context.Context, m meter, workers int, warmup time.Duration, f op, during func(ctx context.Context) error) (*sample, error) {
	var derr error
	s, err := measureWindow(ctx, m, workers, warmup, f, func(ctx context.Context) { derr = during(ctx) })
	if err == nil {
		err = derr
	}
	return s, err
}

// interleave measures a comparison at w workers in -rounds rounds. Each
// round gives each side -duration in two windows of half of it, in the
// order A B B A (which side is A alternating between rounds, each side A in
// half of them as -rounds is even): a drift of
// the machine within a round (PostgreSQL's checkpoints, the disk's flush
// times, warming caches) weighs on both sides alike, where A B would hand
// it to one. A side's round is its two windows summed, and the round's
// ratio is the library's throughput over the hand-written one's. With warm,
// each side first runs once for the warm-up, unmeasured: the row's first
// window would otherwise be the only one on connections that have not yet
// prepared its statements.
func (rep *report) interleave(ctx context.Context, c *comparison, w int, warm bool, log io.Writer,
	run func(s *side, round int, d time.Duration) (*sample, error)) (*compared, error) {
	row := &compared{c: c, workers: w}
	half := rep.opts.duration / 2
	if warm {
		for _, s := range []*side{&c.hand, &c.lib} {
			if _, err := run(s, -1, rep.opts.warmup); err != nil {
				return nil, fmt.Errorf("%s, %d workers, warm-up: %w", s.name, w, err)
			}
		}
	}
	for round := range rep.opts.rounds {
		a, b := &c.hand, &c.lib
		if round%2 == 1 {
			a, b = b, a
		}
		got := map[*side][]*sample{}
		for _, s := range []*side{a, b, b, a} {
			smp, err := run(s, round, half)
			if err != nil {
				return nil, fmt.Errorf("%s, %d workers: %w", s.name, w, err)
			}
			got[s] = append(got[s], smp)
		}
		merged := map[*side]*sample{}
		for _, s := range []*side{a, b} {
			merged[s] = merge(got[s])
			fmt.Fprintf(log, "bench: %-44s %-52s workers=%-3d round=%d %9.0f msg/s%s\n",
				c.name, s.name, w, round+1, merged[s].throughput(), earlyNote(merged[s]))
		}
		lib, hand := merged[&c.lib], merged[&c.hand]
		row.lib, row.hand = append(row.lib, lib), append(row.hand, hand)
		if hand.throughput() > 0 {
			row.ratios = append(row.ratios, lib.throughput()/hand.throughput())
		}
	}
	return row, nil
}
