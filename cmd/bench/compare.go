package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Sections of the report.
const (
	sectionCore      = "core"
	sectionTransport = "transport"
)

// side is one side of a comparison: the library or its hand-written
// equivalent. A core side is an op run by measure on w workers; a transport
// side drains a backlog through a consumer or relay of w workers and
// measures itself.
type side struct {
	name  string
	op    func(b *bench) op
	drain func(b *bench, ctx context.Context, w int, sp span) (*sample, error)
}

// comparison is one row of the report per worker count: the library
// against a hand-written equivalent that does the same work.
type comparison struct {
	name      string // the library's row
	section   string
	unit      func(o *options) string // what one latency sample is
	lib, hand side
	// setup runs once before the comparison's runs (both sides then see the
	// state it made); nil for none.
	setup func(b *bench, ctx context.Context) error
	// fresh empties the tables before every measured run of an op side.
	fresh bool
	// ceiling is a transport's expected throughput at most, in messages per
	// second, which sizes its backlogs (see backlogs).
	ceiling float64
	// reference marks a baseline that does less work than the library (the
	// effect alone, without dedup): its ratio is the price of dedup, not a
	// like-for-like comparison.
	reference bool
}

func perMsg(*options) string     { return "msg" }
func perTx(*options) string      { return "tx" }
func perReq(*options) string     { return "request" }
func perCycle(*options) string   { return "cycle of ≤100" }
func perBatch(o *options) string { return "batch of " + strconv.Itoa(o.batch) }

// comparisons in report order.
var comparisons = []comparison{
	{
		name: "Consumer.Handle, new key", section: sectionCore, unit: perMsg, fresh: true,
		lib:  side{name: "Consumer.Handle", op: func(b *bench) op { return b.opHandle }},
		hand: side{name: "hand-written tx: claim (inbox row) + effect", op: func(b *bench) op { return b.opHandClaimEffect }},
	},
	{
		name: "Consumer.Handle, duplicate", section: sectionCore, unit: perMsg,
		setup: func(b *bench, ctx context.Context) error {
			if err := b.reset(ctx, "d"); err != nil {
				return err
			}
			return b.preloadDuplicates(ctx)
		},
		lib:  side{name: "Consumer.Handle", op: func(b *bench) op { return b.opHandleDup }},
		hand: side{name: "hand-written tx: claim, read the row to classify it", op: func(b *bench) op { return b.opHandDup }},
	},
	{
		name: "Consumer.Handle over database/sql, new key", section: sectionCore, unit: perMsg, fresh: true,
		setup: (*bench).openSQL,
		lib:   side{name: "Consumer.Handle (*sql.Tx)", op: func(b *bench) op { return b.opSQLHandle }},
		hand:  side{name: "hand-written database/sql tx: claim (inbox row) + effect", op: func(b *bench) op { return b.opSQLHandClaimEffect }},
	},
	{
		name: "Consumer.Handle over database/sql, duplicate", section: sectionCore, unit: perMsg,
		setup: func(b *bench, ctx context.Context) error {
			if err := b.openSQL(ctx); err != nil {
				return err
			}
			if err := b.reset(ctx, "d"); err != nil {
				return err
			}
			return b.preloadDuplicates(ctx)
		},
		lib:  side{name: "Consumer.Handle (*sql.Tx)", op: func(b *bench) op { return b.opSQLHandleDup }},
		hand: side{name: "hand-written database/sql tx: claim, read the row to classify it", op: func(b *bench) op { return b.opSQLHandDup }},
	},
	{
		name: "Consumer.Handle, new key, against no dedup", section: sectionCore, unit: perMsg, fresh: true, reference: true,
		lib:  side{name: "Consumer.Handle", op: func(b *bench) op { return b.opHandle }},
		hand: side{name: "hand-written tx: effect only (no dedup)", op: func(b *bench) op { return b.opHandEffect }},
	},
	{
		name: "Inbox.ClaimBatch + effects", section: sectionCore, unit: perBatch, fresh: true,
		lib:  side{name: "Inbox.ClaimBatch + effects", op: func(b *bench) op { return b.opClaimBatch }},
		hand: side{name: "hand-written batch: claim + effects", op: func(b *bench) op { return b.opHandBatch }},
	},
	{
		name: "httpidem, new request", section: sectionCore, unit: perReq, fresh: true,
		lib:  side{name: "httpidem (transactional)", op: func(b *bench) op { return b.http.opNew(b.http.lib) }},
		hand: side{name: "hand-written handler: claim, order, stored response", op: func(b *bench) op { return b.http.opNew(b.http.hand) }},
	},
	{
		name: "httpidem, replay", section: sectionCore, unit: perReq,
		setup: func(b *bench, ctx context.Context) error { return b.http.preloadReplays(ctx) },
		lib:   side{name: "httpidem (transactional)", op: func(b *bench) op { return b.http.opReplay(b.http.lib) }},
		hand:  side{name: "hand-written handler: claim, read the stored response", op: func(b *bench) op { return b.http.opReplay(b.http.hand) }},
	},
	{
		name: "dedupenats.Runner", section: sectionTransport, unit: perTx, ceiling: 8000,
		lib:  side{name: "dedupenats.Runner", drain: (*bench).natsRunner},
		hand: side{name: "hand-written JetStream consumer", drain: (*bench).natsHand},
	},
	{
		name: "dedupenats.Runner, batches of 100", section: sectionTransport, unit: perTx, ceiling: 15000,
		lib:  side{name: "dedupenats.Runner, batches of 100", drain: (*bench).natsRunnerBatch},
		hand: side{name: "hand-written JetStream consumer", drain: (*bench).natsHand},
	},
	{
		name: "dedupenats.Runner, batches of 100, vs batch consumer", section: sectionTransport, unit: perTx, ceiling: 15000,
		lib:  side{name: "dedupenats.Runner, batches of 100", drain: (*bench).natsRunnerBatch},
		hand: side{name: "hand-written JetStream batch consumer", drain: (*bench).natsHandBatch},
	},
	{
		name: "dedupekafka.Runner", section: sectionTransport, unit: perTx, ceiling: 10000,
		lib:  side{name: "dedupekafka.Runner", drain: (*bench).kafkaRunner},
		hand: side{name: "hand-written kafka-go consumer", drain: (*bench).kafkaHand},
	},
	{
		name: "dedupekafka.Runner vs commit per message", section: sectionTransport, unit: perTx, ceiling: 10000,
		lib:  side{name: "dedupekafka.Runner", drain: (*bench).kafkaRunner},
		hand: side{name: "hand-written kafka-go consumer, offset committed per message", drain: (*bench).kafkaHandPerMessage},
	},
	{
		name: "dedupeamqp.Runner", section: sectionTransport, unit: perTx, ceiling: 8000,
		lib:  side{name: "dedupeamqp.Runner", drain: (*bench).amqpRunner},
		hand: side{name: "hand-written amqp091-go consumer", drain: (*bench).amqpHand},
	},
	{
		name: "deduperedis.Runner", section: sectionTransport, unit: perTx, ceiling: 8000,
		lib:  side{name: "deduperedis.Runner", drain: (*bench).redisRunner},
		hand: side{name: "hand-written go-redis consumer", drain: (*bench).redisHand},
	},
	{
		name: "outbox.Relay → JetStream", section: sectionTransport, unit: perCycle, ceiling: 50000,
		lib:  side{name: "outbox.Relay", drain: (*bench).relayLib},
		hand: side{name: "hand-written outbox relay", drain: (*bench).relayHand},
	},
}

// selected reports whether -only picks the comparison.
func (c *comparison) selected(o *options) bool {
	return o.selected(c.name) || o.selected(c.hand.name)
}

// compared is a comparison's outcome at one worker count: one sample per
// side and round, and the ratio of each round.
type compared struct {
	c         *comparison
	workers   int
	lib, hand []*sample
	ratios    []float64 // library throughput over hand-written, per round
}

// costs is a comparison's usage per message on each side.
type costs struct {
	c         *comparison
	lib, hand cost
}

// runComparisons measures the comparisons of a section at every worker
// count in -rounds interleaved rounds (interleave: A B B A windows), so a
// ratio compares runs that saw the same machine. Then it counts each side's
// round trips and allocations per message.
func (rep *report) runComparisons(ctx context.Context, b *bench, section string, log io.Writer) error {
	o := rep.opts
	for i := range comparisons {
		c := &comparisons[i]
		if c.section != section || !c.selected(o) {
			continue
		}
		if c.setup != nil {
			if err := c.setup(b, ctx); err != nil {
				return fmt.Errorf("%s: setup: %w", c.name, err)
			}
		}
		var all []*compared
		for _, w := range o.workers {
			b.quiesce(ctx, log)
			row, err := rep.interleave(ctx, c, w, c.lib.op != nil, log, func(s *side, round int, d time.Duration) (*sample, error) {
				return rep.runSide(ctx, b, c, s, w, round, d)
			})
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			all = append(all, row)
			rep.rows = append(rep.rows, row)
		}
		cs, err := rep.costOf(ctx, b, c, all)
		if err != nil {
			return fmt.Errorf("%s: probe: %w", c.name, err)
		}
		rep.costs = append(rep.costs, cs)
	}
	return nil
}

func earlyNote(s *sample) string {
	if s.drainedEarly {
		return " (backlog drained before the window ended)"
	}
	return ""
}

// runSide measures one side once, for a window of d.
func (rep *report) runSide(ctx context.Context, b *bench, c *comparison, s *side, w, round int, d time.Duration) (*sample, error) {
	o := rep.opts
	tag := fmt.Sprintf("r%d-%d", b.seq.Add(1), round)
	if s.drain != nil {
		// A backlog that ran out during the warm-up measured nothing: the
		// run was faster than its sizing expected (a first round with no
		// faster run observed yet, under -backlog-rate). It runs again, on
		// a backlog four times larger, which the other side of the round
		// then gets too.
		for tries := 1; ; tries++ {
			b.run = tag
			smp, err := s.drain(b, ctx, w, span{backlog: b.backlogs.size(o, c, w, round, d), window: d})
			if errors.Is(err, errBacklogDrained) && tries < 4 {
				b.backlogs.grow(c, w, round)
				tag = fmt.Sprintf("r%d-%d", b.seq.Add(1), round)
				continue
			}
			if err == nil {
				b.backlogs.observed(c, smp)
			}
			return smp, err
		}
	}
	if c.fresh {
		if err := b.reset(ctx, tag); err != nil {
			return nil, err
		}
	}
	return measure(ctx, b.meter, w, o.warmup, d, s.op(b))
}

// costOf is each side's usage per message: for an op side from a probe of
// -probe-ops sequential operations (exact, and free of other workers'
// traffic); for a transport side over all its measured windows.
func (rep *report) costOf(ctx context.Context, b *bench, c *comparison, rows []*compared) (*costs, error) {
	cs := &costs{c: c}
	for _, s := range []struct {
		side *side
		dst  *cost
		pick func(*compared) []*sample
	}{
		{&c.lib, &cs.lib, func(r *compared) []*sample { return r.lib }},
		{&c.hand, &cs.hand, func(r *compared) []*sample { return r.hand }},
	} {
		var all []*sample
		for _, r := range rows {
			all = append(all, s.pick(r)...)
		}
		windows := sampleCost(all)
		if s.side.drain != nil {
			*s.dst = windows
			continue
		}
		if c.fresh {
			if err := b.reset(ctx, fmt.Sprintf("p%d", b.seq.Add(1))); err != nil {
				return nil, err
			}
		}
		got, err := probe(ctx, b.meter, rep.opts.probeOps, s.side.op(b))
		if err != nil {
			return nil, err
		}
		// The server's CPU from the measured windows: a sequential probe is
		// too short for clock ticks of 10ms.
		got.pgCPU, got.pgOK = windows.pgCPU, windows.pgOK
		*s.dst = got
	}
	return cs, nil
}
