package demo

import (
	"fmt"
	"io"
)

// PrintHeader writes what a run of o will do, before it starts: the
// report's lines after its title.
func PrintHeader(w io.Writer, o Options) {
	end := "dropped at exit"
	if o.KeepSchema {
		end = "kept at exit"
	}
	fmt.Fprintf(w, "  PostgreSQL   %s (schema %s, %s)\n", o.DatabaseSource, o.Schema, end)
	fmt.Fprintf(w, "  NATS         in-process JetStream: stream ORDERS, durable %q\n", durableName)
	crash := ""
	if o.CrashOne && o.Consumers > 1 {
		crash = fmt.Sprintf("; consumer %d loses its NATS connection mid-run", o.Consumers)
	}
	fmt.Fprintf(w, "  consumers    %d x %d workers%s\n\n", o.Consumers, o.Workers, crash)
}

// Print writes the report's figures.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "  unique orders         %6d\n", r.Unique)
	fmt.Fprintf(w, "  messages published    %6d   (%d deliberate duplicates under new Nats-Msg-Ids)\n", r.Published, r.Published-r.Unique)
	fmt.Fprintf(w, "  deliveries handled    %6d   (%d redeliveries: %d after a failed attempt, %d after the lost connection or shutdown)\n",
		r.Deliveries, r.Deliveries-r.Published, r.Retries, r.Deliveries-r.Published-r.Retries)
	fmt.Fprintf(w, "  duplicates absorbed   %6d\n", r.Duplicates)
	verdict := "== unique orders: exactly once"
	if !r.OK() {
		verdict = fmt.Sprintf("!= unique orders (%d distinct): MISMATCH", r.DistinctEffects)
	}
	fmt.Fprintf(w, "  effects written       %6d   %s\n", r.Effects, verdict)
	fmt.Fprintf(w, "  time taken            %6.2fs\n", r.Elapsed.Seconds())
	if r.SchemaKept {
		fmt.Fprintf(w, "\n  tables kept in schema %s: shipments, dedupe_inbox, dedupe_outbox (DROP SCHEMA %s CASCADE when done)\n", r.Schema, r.Schema)
	}
}
