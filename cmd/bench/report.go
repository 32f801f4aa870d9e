package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// table is one section of the report.
type table struct {
	title   string
	headers []string
	rows    [][]string
}

// The report's table titles.
const (
	titleCore      = "Library against hand-written, same work"
	titleReference = "The price of deduplication: against a transaction that writes only the effect (less work than dedupe's)"
	titleTransport = "Transports: drain a backlog (workers = JetStream workers, Kafka partitions, relays)"
	titleCost      = "Per message: PostgreSQL round trips and allocations (dedupe / hand-written)"
	titleSizes     = "Consumer.Handle by inbox size"
	titlePurge     = "Retention purge"
	titleTxCPU     = "Server CPU per transaction"
)

func (rep *report) tables() []table {
	var ts []table
	// A reference row's baseline does less work than the library: it goes
	// in a table of its own, never among the rows that compare like for
	// like.
	for _, sec := range []struct {
		section, title string
		reference      bool
	}{{sectionCore, titleCore, false}, {sectionCore, titleReference, true}, {sectionTransport, titleTransport, false}} {
		t := table{title: sec.title, headers: []string{"dedupe", "hand-written", "workers", "msgs/s", "hand msgs/s",
			"ratio", "ratio min–max", "p50 / p99", "hand p50 / p99", "latency of", "PG CPU/msg"}}
		for _, r := range rep.rows {
			if r.c.section != sec.section || r.c.reference != sec.reference {
				continue
			}
			lib, hand := merge(r.lib), merge(r.hand)
			t.rows = append(t.rows, []string{r.c.name + refMark(r.c), r.c.hand.name, fmt.Sprint(r.workers),
				rate(lib), rate(hand), ratioMedian(r.ratios), ratioRange(r.ratios),
				lat(lib), lat(hand), r.c.unit(rep.opts) + earlyMark(r), pgCPUPair(r)})
		}
		if len(t.rows) > 0 {
			ts = append(ts, t)
		}
	}
	if len(rep.costs) > 0 {
		t := table{title: titleCost, headers: []string{"dedupe", "hand-written", "round trips", "allocs", "bytes", "counted"}}
		for _, c := range rep.costs {
			how := fmt.Sprintf("%d sequential ops", rep.opts.probeOps)
			if c.c.section == sectionTransport {
				how = "measured windows, whole process (in-process broker included)"
			}
			t.rows = append(t.rows, []string{c.c.name + refMark(c.c), c.c.hand.name,
				pair(c.lib.roundTrips, c.hand.roundTrips, "%.2f", c), pair(c.lib.allocs, c.hand.allocs, "%.0f", c),
				pair(c.lib.bytes, c.hand.bytes, "%.0f", c), how})
		}
		ts = append(ts, t)
	}
	if len(rep.sizes) > 0 {
		t := table{title: fmt.Sprintf("%s (%d workers; against an empty inbox in the same rounds)", titleSizes, rep.opts.sizeWorkers),
			headers: []string{"inbox rows", "msgs/s", "empty inbox msgs/s", "ratio", "ratio min–max", "p50 / p99", "empty p50 / p99", "PG CPU/msg"}}
		for _, r := range rep.sizes {
			lib, hand := merge(r.lib), merge(r.hand)
			t.rows = append(t.rows, []string{r.c.name, rate(lib), rate(hand), ratioMedian(r.ratios), ratioRange(r.ratios), lat(lib), lat(hand), pgCPUPair(r)})
		}
		ts = append(ts, t)
	}
	if t, ok := rep.txCPUTable(); ok {
		ts = append(ts, t)
	}
	if len(rep.purgeAlone) > 0 {
		n := rep.opts.purgeRows
		t := table{title: fmt.Sprintf("%s: Inbox.Purge of %d expired keys (default batch size)", titlePurge, n),
			headers: []string{"run", "purge time, median (min–max)", "keys/s (median)", "PG CPU of the purge", "Consumer.Handle msgs/s meanwhile", "no purge msgs/s", "ratio", "ratio min–max"}}
		cpu := "—"
		if len(rep.purgeAloneCPU) > 0 {
			cpu = durRange(rep.purgeAloneCPU)
		}
		t.rows = append(t.rows, []string{"Purge alone", durRange(rep.purgeAlone), keysPerSec(n, rep.purgeAlone), cpu, "—", "—", "—", "—"})
		if r := rep.purge; r != nil {
			lib, hand := merge(r.lib), merge(r.hand)
			t.rows = append(t.rows, []string{fmt.Sprintf("Purge while Consumer.Handle runs (%d workers)", r.workers),
				durRange(rep.purgeLoaded), keysPerSec(n, rep.purgeLoaded), "—", rate(lib), rate(hand), ratioMedian(r.ratios), ratioRange(r.ratios)})
		}
		ts = append(ts, t)
	}
	return ts
}

func (rep *report) caption() string {
	return fmt.Sprintf("PostgreSQL %s on loopback, %d CPU cores seen by Go. %d interleaved rounds per row: the hand-written side "+
		"and dedupe each run for %v per round, in two windows of half of it in the order A B B A (which side is A alternating: each is A in half of the rounds), "+
		"each window after %v of warm-up; a core row's sides first run once unmeasured. "+
		"msgs/s = all rounds' messages ÷ all rounds' measured time; ratio = dedupe msgs/s ÷ hand-written msgs/s "+
		"within a round, median of the rounds (≥ 1: dedupe is as fast); latencies over all rounds.",
		rep.server, rep.cores, rep.opts.rounds, rep.opts.duration, rep.opts.warmup)
}

// merge sums samples (a side's windows, or its rounds): their messages,
// measured time, latencies and usage.
func merge(ss []*sample) *sample {
	m := &sample{usage: usage{pgOK: len(ss) > 0}}
	for _, s := range ss {
		m.msgs += s.msgs
		m.elapsed += s.elapsed
		m.lat = append(m.lat, s.lat...)
		m.drainedEarly = m.drainedEarly || s.drainedEarly
		m.usage = m.usage.add(s.usage)
	}
	slices.Sort(m.lat)
	return m
}

func rate(s *sample) string { return fmt.Sprintf("%.0f", s.throughput()) }

func lat(s *sample) string {
	return dur(percentile(s.lat, 0.50)) + " / " + dur(percentile(s.lat, 0.99))
}

func ratioMedian(rs []float64) string {
	if len(rs) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", median(rs))
}

func ratioRange(rs []float64) string {
	if len(rs) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f–%.2f", slices.Min(rs), slices.Max(rs))
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func durRange(ds []time.Duration) string {
	s := slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("%v (%v–%v)", dur(s[len(s)/2]), dur(s[0]), dur(s[len(s)-1]))
}

func keysPerSec(n int64, ds []time.Duration) string {
	s := slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("%.0f", float64(n)/max(s[len(s)/2].Seconds(), 1e-9))
}

func pair(lib, hand float64, format string, c *costs) string {
	if !c.lib.valid || !c.hand.valid {
		return "—"
	}
	return fmt.Sprintf(format+" / "+format, lib, hand)
}

// pgCPUPair is the PostgreSQL CPU per message of both sides of a row over
// its measured windows.
func pgCPUPair(r *compared) string {
	lib, hand := sampleCost(r.lib), sampleCost(r.hand)
	if !lib.pgOK || !hand.pgOK {
		return "—"
	}
	return dur(lib.pgCPU) + " / " + dur(hand.pgCPU)
}

// refMark flags a row whose baseline does less work than the library.
func refMark(c *comparison) string {
	if c.reference {
		return " (price of dedup)"
	}
	return ""
}

// earlyMark flags a transport row whose backlog ran out inside a window.
func earlyMark(r *compared) string {
	for _, s := range slices.Concat(r.lib, r.hand) {
		if s.drainedEarly {
			return " (a backlog ran out early)"
		}
	}
	return ""
}

func dur(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}

// text prints the report as aligned columns.
func (rep *report) text(w io.Writer) {
	fmt.Fprintln(w, rep.caption())
	for _, t := range rep.tables() {
		fmt.Fprintf(w, "\n%s\n", t.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(t.headers, "\t"))
		for _, row := range t.rows {
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		_ = tw.Flush()
	}
}

// markdown prints the report as Markdown tables for the README.
func (rep *report) markdown(w io.Writer) {
	fmt.Fprintln(w, rep.caption())
	for _, t := range rep.tables() {
		fmt.Fprintf(w, "\n#### %s\n\n", t.title)
		fmt.Fprintf(w, "| %s |\n", strings.Join(t.headers, " | "))
		seps := make([]string, len(t.headers))
		for i := range seps {
			seps[i] = "---"
		}
		fmt.Fprintf(w, "|%s|\n", strings.Join(seps, "|"))
		for _, row := range t.rows {
			cells := make([]string, len(row))
			for i, c := range row {
				cells[i] = strings.ReplaceAll(c, "|", `\|`)
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
		}
	}
}
