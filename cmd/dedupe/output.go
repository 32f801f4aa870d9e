package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// emit writes v as one JSON document when --json is set, and otherwise calls
// text to render it for people.
func (c *cli) emit(w io.Writer, v any, text func(w io.Writer)) {
	if c.g.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			fmt.Fprintf(c.stderr, "dedupe: encode output: %v\n", err)
		}
		return
	}
	writeTable(w, text)
}

// writeTable renders text's tab-separated columns aligned.
func writeTable(w io.Writer, text func(w io.Writer)) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	text(tw)
	_ = tw.Flush()
}

// jsonTime is a time that encodes as RFC 3339 in UTC, or null when zero.
type jsonTime struct{ time.Time }

func (t jsonTime) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return json.Marshal(t.UTC().Format(time.RFC3339Nano))
}

// text renders the time for people.
func (t jsonTime) text() string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// bodyFields holds a stored body as text when it is UTF-8 and as base64
// (encoding/json's []byte) otherwise.
type bodyFields struct {
	Body       *string `json:"body,omitempty"`
	BodyBase64 []byte  `json:"body_base64,omitempty"`
}

func newBodyFields(b []byte) bodyFields {
	if len(b) == 0 {
		return bodyFields{}
	}
	if utf8.Valid(b) {
		s := string(b)
		return bodyFields{Body: &s}
	}
	return bodyFields{BodyBase64: b}
}
