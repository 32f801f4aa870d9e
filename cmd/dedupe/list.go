package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// defaultListLimit is how many keys inspect --prefix lists by default.
const defaultListLimit = 100

// listSQL lists the keys of a scope that start with a prefix, in key order,
// optionally in one state; {{table}} is the inbox, quoted and qualified.
const listSQL = `SELECT key, state, attempts, COALESCE(last_error, ''), updated_at FROM {{table}}
WHERE scope = $1 AND starts_with(key, $2) AND ($3 = '' OR state = $3)
ORDER BY key LIMIT $4`

// listedKey is one key as inspect --prefix lists it.
type listedKey struct {
	Key       string       `json:"key"`
	State     dedupe.State `json:"state"`
	Attempts  int          `json:"attempts"`
	LastError string       `json:"last_error,omitempty"`
	UpdatedAt jsonTime     `json:"updated_at"`
}

// keyList is what inspect --prefix prints.
type keyList struct {
	Scope  string      `json:"scope"`
	Prefix string      `json:"prefix"`
	State  string      `json:"state,omitempty"`
	Keys   []listedKey `json:"keys"`
	// More is true when the limit cut the list short.
	More bool `json:"more"`
}

// listKeys lists the keys of scope that start with prefix (in state, when
// set), at most limit of them: how operators find the messages an adapter
// refused (dedupekafka-refused/, dedupenats-refused/, deduperedis-refused/)
// or every failed key of a consumer.
func listKeys(ctx context.Context, c *cli, scope, prefix, state string, limit int) (*keyList, error) {
	pool, inbox, err := c.connect(ctx, dedupe.Config{})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	cfg := inbox.Config()
	table := pgx.Identifier{cfg.Table}
	if cfg.Schema != "" {
		table = pgx.Identifier{cfg.Schema, cfg.Table}
	}
	rows, err := pool.Query(ctx, strings.Replace(listSQL, "{{table}}", table.Sanitize(), 1), scope, prefix, state, limit+1)
	if err != nil {
		return nil, err
	}
	out := &keyList{Scope: scope, Prefix: prefix, State: state, Keys: []listedKey{}}
	for rows.Next() {
		var (
			k  listedKey
			st string
			at time.Time
		)
		if err := rows.Scan(&k.Key, &st, &k.Attempts, &k.LastError, &at); err != nil {
			rows.Close()
			return nil, err
		}
		k.State, k.UpdatedAt = dedupe.State(st), jsonTime{at}
		out.Keys = append(out.Keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out.Keys) > limit {
		out.Keys, out.More = out.Keys[:limit], true
	}
	return out, nil
}

// writeText renders the list for people: one key a line.
func (l *keyList) writeText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tATTEMPTS\tUPDATED\tLAST ERROR")
	for _, k := range l.Keys {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", k.Key, k.State, k.Attempts, k.UpdatedAt.text(), cell(k.LastError, 120))
	}
	_ = tw.Flush()
	if l.More {
		fmt.Fprintf(w, "(more keys: raise --limit)\n")
	}
}

// cell returns s on one line, cut to at most n runes, for a table cell.
func cell(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
