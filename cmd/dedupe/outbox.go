package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// outboxFlags are the flags of outbox.
type outboxFlags struct {
	id, by, reason string
	limit          int
	yes            bool
}

func outboxCommand() *command {
	return &command{
		name:     "outbox",
		synopsis: "outbox parked | unpark --id ID | discard --id ID --reason WHY [--by WHO] --yes",
		summary:  "list parked outbox messages, retry one (unpark) or drop one for good (discard)",
		about: `A relay parks an outbox message that was refused for good or failed all its
attempts while the broker took others. A parked message holds back the later
messages of its key (their order is kept) until an operator decides.

outbox parked lists the parked messages of the outbox table (--outbox-table),
oldest first, with the error that parked them.
outbox unpark --id ID hands one back to the relays with fresh attempts, once
its cause is fixed.
outbox discard --id ID --reason WHY drops one for good, so that the later
messages of its key go out: when it must never be published, or was sent by
other means. Who (--by, defaulting to the operating-system user and host),
when and why are stored in its row and logged; without --yes it only shows the
message and exits 2.

unpark and discard exit 3 when no parked message has that ID.`,
		flags: func(fs *flag.FlagSet) any {
			o := &outboxFlags{}
			fs.StringVar(&o.id, "id", "", "the parked message's `ID` (unpark, discard)")
			fs.StringVar(&o.reason, "reason", "", "`why` the message is discarded, stored with it (discard). Required.")
			fs.StringVar(&o.by, "by", "", "`who` discards it, stored with it (discard). Defaults to user@host.")
			fs.IntVar(&o.limit, "limit", 100, "list at most `N` messages (parked). Defaults to 100.")
			fs.BoolVar(&o.yes, "yes", false, "really discard the message. Defaults to false (show it and exit 2).")
			return o
		},
		run: runOutbox,
	}
}

// outboxMessageJSON is a parked or discarded message as outbox prints it.
type outboxMessageJSON struct {
	ID      string              `json:"id"`
	Topic   string              `json:"topic"`
	Key     string              `json:"key"`
	Headers map[string][]string `json:"headers,omitempty"`
	bodyFields
	Attempts      int      `json:"attempts"`
	LastError     string   `json:"last_error,omitempty"`
	CreatedAt     jsonTime `json:"created_at"`
	ParkedAt      jsonTime `json:"parked_at"`
	DiscardedAt   jsonTime `json:"discarded_at,omitzero"`
	DiscardedBy   string   `json:"discarded_by,omitempty"`
	DiscardReason string   `json:"discard_reason,omitempty"`
}

func newOutboxMessageJSON(m *outbox.StoredMessage) outboxMessageJSON {
	return outboxMessageJSON{ID: m.ID, Topic: m.Topic, Key: m.Key, Headers: m.Headers, bodyFields: newBodyFields(m.Payload),
		Attempts: m.Attempt, LastError: m.LastError, CreatedAt: jsonTime{m.CreatedAt}, ParkedAt: jsonTime{m.ParkedAt}}
}

func runOutbox(ctx context.Context, c *cli, opts any, args []string) int {
	o := opts.(*outboxFlags)
	if len(args) == 0 {
		return c.fail("outbox", usagef("which action? (parked, unpark or discard)"))
	}
	action := args[0]
	if len(args) > 1 {
		return c.fail("outbox", usagef("unexpected argument %q", args[1]))
	}
	switch {
	case action != "parked" && action != "unpark" && action != "discard":
		return c.fail("outbox", usagef("unknown action %q (want parked, unpark or discard)", action))
	case action != "parked" && o.id == "":
		return c.fail("outbox", usagef("outbox %s needs --id", action))
	case action == "discard" && strings.TrimSpace(o.reason) == "":
		return c.fail("outbox", usagef("outbox discard needs --reason: it is stored with the message"))
	case o.limit < 1:
		return c.fail("outbox", usagef("--limit must be at least 1"))
	}
	pool, ob, err := c.connectOutbox(ctx)
	if err != nil {
		return c.fail("outbox", err)
	}
	defer pool.Close()
	switch action {
	case "parked":
		return c.outboxParked(ctx, ob, o.limit)
	case "unpark":
		if err := ob.Unpark(ctx, o.id); err != nil {
			return c.fail("outbox", parkedNotFound(o.id, err))
		}
		c.emit(c.stdout, map[string]any{"unparked": o.id}, func(w io.Writer) {
			fmt.Fprintf(w, "unparked %s: the relays retry it with fresh attempts\n", o.id)
		})
		return exitOK
	}
	return c.outboxDiscard(ctx, ob, o)
}

// connectOutbox opens a small pool and the outbox of the global flags. The
// caller closes the pool.
func (c *cli) connectOutbox(ctx context.Context) (*pgxpool.Pool, *outbox.Outbox, error) {
	pool, _, err := c.connect(ctx, dedupe.Config{})
	if err != nil {
		return nil, nil, err
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: c.g.schema, Table: c.g.outboxTable, Logger: c.log})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, ob, nil
}

func (c *cli) outboxParked(ctx context.Context, ob *outbox.Outbox, limit int) int {
	msgs, err := ob.Parked(ctx, limit)
	if err != nil {
		return c.fail("outbox", err)
	}
	out := make([]outboxMessageJSON, len(msgs))
	for i, m := range msgs {
		out[i] = newOutboxMessageJSON(m)
	}
	c.emit(c.stdout, map[string]any{"table": ob.Config().Table, "parked": out}, func(w io.Writer) {
		if len(out) == 0 {
			fmt.Fprintf(w, "outbox %s: nothing parked\n", ob.Config().Table)
			return
		}
		fmt.Fprintln(w, "ID\tTOPIC\tKEY\tATTEMPTS\tPARKED AT\tLAST ERROR")
		for _, m := range out {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, m.Topic, or(m.Key, "-"), m.Attempts, m.ParkedAt.text(), oneLine(m.LastError))
		}
	})
	return exitOK
}

func (c *cli) outboxDiscard(ctx context.Context, ob *outbox.Outbox, o *outboxFlags) int {
	if !o.yes {
		msgs, err := ob.Parked(ctx, 10000)
		if err != nil {
			return c.fail("outbox", err)
		}
		var found *outbox.StoredMessage
		for _, m := range msgs {
			if m.ID == o.id {
				found = m
			}
		}
		if found == nil {
			return c.fail("outbox", parkedNotFound(o.id, dedupe.ErrNotFound))
		}
		if !c.g.json {
			m := newOutboxMessageJSON(found)
			writeTable(c.stderr, func(w io.Writer) {
				fmt.Fprintf(w, "id\t%s\ntopic\t%s\nkey\t%s\nattempts\t%d\nparked at\t%s\nlast error\t%s\n",
					m.ID, m.Topic, or(m.Key, "-"), m.Attempts, m.ParkedAt.text(), oneLine(m.LastError))
			})
		}
		return c.fail("outbox", usagef("not discarded: pass --yes to discard %s for good", o.id))
	}
	by := o.by
	if by == "" {
		by = operator()
	}
	d, err := ob.Discard(ctx, o.id, by, o.reason)
	if err != nil {
		return c.fail("outbox", parkedNotFound(o.id, err))
	}
	m := newOutboxMessageJSON(&d.StoredMessage)
	m.DiscardedAt, m.DiscardedBy, m.DiscardReason = jsonTime{d.DiscardedAt}, d.DiscardedBy, d.DiscardReason
	c.emit(c.stdout, map[string]any{"discarded": m}, func(w io.Writer) {
		fmt.Fprintf(w, "discarded %s (topic %s, key %s, %d attempts) by %s: %s\n", m.ID, m.Topic, or(m.Key, "-"),
			m.Attempts, m.DiscardedBy, m.DiscardReason)
	})
	return exitOK
}

// operator names who runs the command: user@host, as well as it can.
func operator() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	switch {
	case name == "" && host == "":
		return "dedupe-cli"
	case host == "":
		return name
	}
	return name + "@" + host
}

// oneLine keeps the first line of s for a table cell.
func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if s == "" {
		return "-"
	}
	return s
}

// or returns s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
