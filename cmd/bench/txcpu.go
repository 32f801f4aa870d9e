package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// The server-CPU section: where the price of deduplication goes, measured
// per transaction on one backend. Throughput rows on two shared cores move
// with everything else the machine does; the CPU one backend spends on one
// transaction hardly does. So every variant runs on the same connection, one
// transaction of each in turn (the order rotating every round), and each
// transaction is billed the CPU its backend used while it ran, read from
// /proc/<pid>/schedstat (nanoseconds) before and after.

// txVariant is one transaction shape of the server-CPU section.
type txVariant struct {
	name string
	op   func(b *bench) op
}

// txVariants are the server-CPU section's transactions, cheapest first.
var txVariants = []txVariant{
	{"hand-written tx: effect only (no dedup)", func(b *bench) op { return b.opHandEffect }},
	{"hand-written tx: claim (inbox row) + effect", func(b *bench) op { return b.opHandClaimEffect }},
	{"hand-written tx: claim + savepoint + effect", func(b *bench) op { return b.opHandClaimSavepointEffect }},
	{"Consumer.Handle, new key", func(b *bench) op { return b.opHandle }},
}

// txCPUResult is the server CPU of each transaction of one variant.
type txCPUResult struct {
	name string
	cpu  []time.Duration
}

// opHandClaimSavepointEffect is the hand-written claim and effect with the
// savepoint dedupe takes after its claim (to count a failed attempt while the
// claim is held, and to prove at COMMIT that the transaction still holds it),
// sent as dedupe sends it: BEGIN, the claim and SAVEPOINT in one pipeline,
// the effect, then RELEASE SAVEPOINT and COMMIT as one query. Against the
// hand-written claim + effect it prices the savepoint alone.
func (b *bench) opHandClaimSavepointEffect(ctx context.Context, _ int) (int, error) {
	id := b.nextID()
	now := time.Now()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return 1, err
	}
	defer conn.Release()
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(sqlHandClaim, benchScope, id, now, now.Add(dedupe.DefaultRetention))
	batch.Queue("SAVEPOINT claimed")
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		return 1, err
	}
	if _, err := conn.Exec(ctx, sqlEffect, id, body); err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		return 1, err
	}
	_, err = conn.Exec(ctx, "RELEASE SAVEPOINT claimed; COMMIT")
	return 1, err
}

// runTxCPU measures -tx-cpu transactions of each variant on a pool of one
// connection in the run's schema (cfg).
func (rep *report) runTxCPU(ctx context.Context, cfg *pgxpool.Config, log io.Writer) error {
	n := rep.opts.txCPU
	if n <= 0 || !rep.opts.selected(titleTxCPU) {
		return nil
	}
	cfg = cfg.Copy()
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "dedupe-bench-txcpu"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	if _, ok := schedCPU(pid); !ok {
		fmt.Fprintf(log, "bench: server CPU per transaction skipped: /proc/%d/schedstat is not readable (the server is not on this machine, or schedstats are off)\n", pid)
		return nil
	}
	b, err := newBench(rep.opts, pool, meter{})
	if err != nil {
		return err
	}
	if err := b.reset(ctx, "tx"); err != nil {
		return err
	}
	ops := make([]op, len(txVariants))
	res := make([]*txCPUResult, len(txVariants))
	for i, v := range txVariants {
		ops[i] = v.op(b)
		res[i] = &txCPUResult{name: v.name, cpu: make([]time.Duration, 0, n)}
	}
	// Unmeasured: every statement prepared, caches warm.
	for range 50 {
		for _, o := range ops {
			if _, err := o(ctx, 0); err != nil {
				return err
			}
		}
	}
	start := time.Now()
	for round := range n {
		for k := range ops {
			i := (round + k) % len(ops)
			c0, _ := schedCPU(pid)
			if _, err := ops[i](ctx, 0); err != nil {
				return fmt.Errorf("%s: %w", txVariants[i].name, err)
			}
			c1, ok := schedCPU(pid)
			if !ok {
				return fmt.Errorf("server CPU per transaction: backend %d gone", pid)
			}
			res[i].cpu = append(res[i].cpu, c1-c0)
		}
	}
	for _, r := range res {
		slices.Sort(r.cpu)
	}
	fmt.Fprintf(log, "bench: server CPU per transaction: %d of each of %d variants in %v\n", n, len(ops), time.Since(start).Round(time.Millisecond))
	rep.txCPU = res
	return nil
}

// schedCPU returns the CPU time a process has spent on a CPU so far, from the
// first field of /proc/<pid>/schedstat.
func schedCPU(pid int) (time.Duration, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		return 0, false
	}
	f := bytes.Fields(raw)
	if len(f) == 0 {
		return 0, false
	}
	ns, err := strconv.ParseInt(string(f[0]), 10, 64)
	return time.Duration(ns), err == nil
}

// txCPUTable is the server-CPU section as a table: median, lower quartile
// and mean per transaction, and the median above the effect alone.
func (rep *report) txCPUTable() (table, bool) {
	if len(rep.txCPU) == 0 {
		return table{}, false
	}
	t := table{title: fmt.Sprintf("%s (%d transactions of each, interleaved on one backend)", titleTxCPU, rep.opts.txCPU),
		headers: []string{"transaction", "median", "lower quartile", "mean", "median above the effect alone"}}
	// runTxCPU left each variant's times sorted.
	base := rep.txCPU[0].cpu[len(rep.txCPU[0].cpu)/2]
	for _, r := range rep.txCPU {
		s := r.cpu
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		med := s[len(s)/2]
		t.rows = append(t.rows, []string{r.name, us(med), us(s[len(s)/4]), us(sum / time.Duration(len(s))), usDelta(med - base)})
	}
	return t, true
}

// us formats d in microseconds with one decimal.
func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

// usDelta formats a difference in microseconds with its sign.
func usDelta(d time.Duration) string {
	return fmt.Sprintf("%+.1f µs", float64(d)/float64(time.Microsecond))
}
