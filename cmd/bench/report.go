package main

import (
	"fmt"
	"io"
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

func (rep *report) tables() []table {
	var ts []table
	if len(rep.main) > 0 {
		t := table{title: "Throughput and latency (all keys new)",
			headers: []string{"scenario", "workers", "msgs/s", "p50", "p99", "latency of", "vs", "ratio"}}
		for _, r := range rep.main {
			t.rows = append(t.rows, []string{r.scenario, fmt.Sprint(r.workers), fmt.Sprintf("%.0f", r.throughput()),
				dur(r.p50), dur(r.p99), r.unit, or(r.baseline, "—"), ratio(r)})
		}
		ts = append(ts, t)
	}
	if len(rep.sizes) > 0 {
		t := table{title: fmt.Sprintf("Consumer.Handle by inbox size (%d workers)", rep.opts.sizeWorkers),
			headers: []string{"inbox rows", "msgs/s", "p50", "p99", "ratio to empty inbox"}}
		for _, r := range rep.sizes {
			t.rows = append(t.rows, []string{r.scenario, fmt.Sprintf("%.0f", r.throughput()), dur(r.p50), dur(r.p99), ratio(r)})
		}
		ts = append(ts, t)
	}
	if len(rep.transports) > 0 {
		t := table{title: fmt.Sprintf("Transports: drain %d pre-published messages (workers = JetStream workers, Kafka partitions, relays)", rep.opts.transportMsgs),
			headers: []string{"consumer", "workers", "msgs/s", "p50", "p99", "latency of", "vs", "ratio"}}
		for _, r := range rep.transports {
			t.rows = append(t.rows, []string{r.scenario, fmt.Sprint(r.workers), fmt.Sprintf("%.0f", r.throughput()),
				dur(r.p50), dur(r.p99), r.unit, or(r.baseline, "—"), or(r.note, ratio(r))})
		}
		ts = append(ts, t)
	}
	if len(rep.purge) > 0 {
		t := table{title: fmt.Sprintf("Retention purge while consumers run (%d workers)", rep.opts.sizeWorkers),
			headers: []string{"run", "msgs/s", "p50", "p99", "ratio", "note"}}
		for _, r := range rep.purge {
			t.rows = append(t.rows, []string{r.scenario, fmt.Sprintf("%.0f", r.throughput()), dur(r.p50), dur(r.p99), ratio(r), r.note})
		}
		ts = append(ts, t)
	}
	return ts
}

func (rep *report) caption() string {
	return fmt.Sprintf("PostgreSQL %s, %v per row after %v warm-up, batch %d; %d round(s), median kept; ratio = throughput / throughput of the \"vs\" row at the same worker count, measured back to back (median of the rounds' ratios).",
		rep.server, rep.opts.duration, rep.opts.warmup, rep.opts.batch, rep.opts.rounds)
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

func ratio(r *result) string {
	if r.ratio == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", r.ratio)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
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
			if i > 0 && i < len(t.headers) {
				seps[i] = "---:"
			}
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
