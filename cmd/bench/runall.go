package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/scratch"
)

// report is everything one run measured.
type report struct {
	opts  *options
	main  []*result
	sizes []*result // scenario holds the inbox size
	purge []*result
	// transports drain a fixed number of messages per row.
	transports []*result
	started    time.Time
	server     string
}

// runAll sets up a private schema, measures every section and drops the
// schema.
func runAll(ctx context.Context, o *options, log io.Writer) (*report, error) {
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
	rep := &report{opts: o, started: time.Now()}
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&rep.server)
	be, err := newBench(o, pool)
	if err != nil {
		return nil, err
	}
	if err := rep.runMain(ctx, be, log); err != nil {
		return nil, err
	}
	if err := rep.runSizes(ctx, be, log); err != nil {
		return nil, err
	}
	if err := rep.runPurge(ctx, be, log); err != nil {
		return nil, err
	}
	if o.transports {
		if err := rep.runTransports(ctx, be, schema, log); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// reset empties the tables and gives the next row its own keys.
func (b *bench) reset(ctx context.Context, tag string) error {
	b.run = tag
	_, err := b.pool.Exec(ctx, sqlReset)
	return err
}

// runMain measures every scenario at every worker count. The scenarios of
// one worker count run back to back, so that a baseline and the scenario
// compared with it see the same machine; with -rounds > 1 the whole sweep
// repeats and the round of median throughput is kept per row.
func (rep *report) runMain(ctx context.Context, b *bench, log io.Writer) error {
	o := rep.opts
	type rowKey struct {
		scenario string
		workers  int
	}
	runs := map[rowKey][]*result{}
	var order []rowKey
	for round := range o.rounds {
		var thisRound []*result
		for _, w := range o.workers {
			for _, sc := range scenarios {
				if !o.selected(sc.name) {
					continue
				}
				if err := b.reset(ctx, fmt.Sprintf("r%d-%d", round, len(order))); err != nil {
					return err
				}
				r, err := measure(ctx, w, o.warmup, o.duration, sc.op(b))
				if err != nil {
					return fmt.Errorf("%s, %d workers: %w", sc.name, w, err)
				}
				r.scenario, r.baseline, r.unit = sc.name, sc.baseline, sc.unit(o)
				k := rowKey{sc.name, w}
				if round == 0 {
					order = append(order, k)
				}
				runs[k] = append(runs[k], r)
				thisRound = append(thisRound, r)
				fmt.Fprintf(log, "bench: %-40s workers=%-3d %9.0f msg/s p50=%v p99=%v\n", sc.name, w, r.throughput(), r.p50, r.p99)
			}
		}
		fillRatios(thisRound) // a ratio compares measurements of the same round
	}
	for _, sc := range scenarios {
		for _, w := range o.workers {
			rs, ok := runs[rowKey{sc.name, w}]
			if !ok {
				continue
			}
			ratios := make([]float64, len(rs))
			for i, r := range rs {
				ratios[i] = r.ratio
			}
			slices.Sort(ratios)
			slices.SortFunc(rs, func(a, b *result) int { return cmp.Compare(a.throughput(), b.throughput()) })
			med := *rs[len(rs)/2]
			med.ratio = ratios[len(ratios)/2]
			rep.main = append(rep.main, &med)
		}
	}
	return nil
}

// fillRatios sets each result's ratio to its baseline's throughput at the
// same worker count.
func fillRatios(rs []*result) {
	for _, r := range rs {
		if r.baseline == "" {
			continue
		}
		for _, base := range rs {
			if base.scenario == r.baseline && base.workers == r.workers && base.throughput() > 0 {
				r.ratio = r.throughput() / base.throughput()
			}
		}
	}
}

// runSizes measures Consumer.Handle with the inbox preloaded to each size,
// against the empty inbox.
func (rep *report) runSizes(ctx context.Context, b *bench, log io.Writer) error {
	o := rep.opts
	if len(o.inboxRows) == 0 {
		return nil
	}
	sizes := append([]int64{0}, o.inboxRows...)
	for _, n := range sizes {
		if err := b.reset(ctx, fmt.Sprintf("s%d", n)); err != nil {
			return err
		}
		if err := preload(ctx, b.pool, n, time.Now().Add(dedupe.DefaultRetention)); err != nil {
			return err
		}
		r, err := measure(ctx, o.sizeWorkers, o.warmup, o.duration, b.opHandle)
		if err != nil {
			return fmt.Errorf("inbox of %d rows: %w", n, err)
		}
		r.scenario, r.unit = strconv.FormatInt(n, 10), "msg"
		if n > 0 {
			r.baseline = "0"
		}
		rep.sizes = append(rep.sizes, r)
		fmt.Fprintf(log, "bench: inbox=%-10d workers=%-3d %9.0f msg/s p50=%v p99=%v\n", n, o.sizeWorkers, r.throughput(), r.p50, r.p99)
	}
	fillRatios(rep.sizes)
	return nil
}

// preload fills the inbox with n keys of another scope expiring at expires.
func preload(ctx context.Context, pool *pgxpool.Pool, n int64, expires time.Time) error {
	if n == 0 {
		return nil
	}
	if _, err := pool.Exec(ctx, sqlPreload, n, expires); err != nil {
		return fmt.Errorf("preload %d rows: %w", n, err)
	}
	_, err := pool.Exec(ctx, sqlAnalyze)
	return err
}

// runPurge measures Consumer.Handle over an inbox holding -inbox-rows[0]
// expired keys, without and then with Inbox.Purge deleting them meanwhile.
func (rep *report) runPurge(ctx context.Context, b *bench, log io.Writer) error {
	o := rep.opts
	if !o.purge || len(o.inboxRows) == 0 {
		return nil
	}
	n := o.inboxRows[0]
	for _, purging := range []bool{false, true} {
		if err := b.reset(ctx, fmt.Sprintf("p%v", purging)); err != nil {
			return err
		}
		if err := preload(ctx, b.pool, n, time.Now().Add(-time.Hour)); err != nil {
			return err
		}
		var (
			deleted  int64
			purgeDur time.Duration
			purgeErr error
			done     = make(chan struct{})
		)
		pctx, cancel := context.WithCancel(ctx)
		if purging {
			go func() {
				defer close(done)
				sleepCtx(pctx, o.warmup) // start when the measurement does
				start := time.Now()
				deleted, purgeErr = b.inbox.Purge(pctx, 0)
				purgeDur = time.Since(start)
			}()
		} else {
			close(done)
		}
		r, err := measure(ctx, o.sizeWorkers, o.warmup, o.duration, b.opHandle)
		cancel()
		<-done
		if err != nil {
			return fmt.Errorf("purge run: %w", err)
		}
		if purgeErr != nil && pctx.Err() == nil {
			return fmt.Errorf("purge: %w", purgeErr)
		}
		r.unit = "msg"
		if purging {
			r.scenario, r.baseline = "Handle while Purge runs", "Handle, no purge"
			r.note = fmt.Sprintf("purged %d of %d expired keys in %v (%.0f keys/s)", deleted, n,
				purgeDur.Round(time.Millisecond), float64(deleted)/max(purgeDur.Seconds(), 1e-9))
		} else {
			r.scenario = "Handle, no purge"
			r.note = fmt.Sprintf("%d expired keys present", n)
		}
		rep.purge = append(rep.purge, r)
		fmt.Fprintf(log, "bench: %-40s workers=%-3d %9.0f msg/s p50=%v p99=%v %s\n", r.scenario, o.sizeWorkers, r.throughput(), r.p50, r.p99, r.note)
	}
	fillRatios(rep.purge)
	return nil
}
