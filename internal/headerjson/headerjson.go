// Package headerjson encodes a stored result's headers for the inbox's
// jsonb column: what encoding/json writes, byte for byte, in one
// allocation, and as the statement argument every pgx statement mode and
// driver reads as JSON.
package headerjson

import (
	"slices"
	"unicode/utf8"
)

// Encode encodes result headers for the jsonb column: what
// json.Marshal returns for h, byte for byte, in one allocation instead of
// json.Marshal's reflection over the map.
func Encode(h map[string][]string) ([]byte, error) {
	if h == nil {
		return nil, nil
	}
	names := make([]string, 0, 16)
	size := 2
	for name, vals := range h {
		names = append(names, name)
		size += len(name) + 6
		for _, v := range vals {
			size += len(v) + 3
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, name)
		b = append(b, ':')
		vals := h[name]
		if vals == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for j, v := range vals {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

// Arg is h as the statement argument of the jsonb column: NULL for
// nil, else its JSON as a string. A string is sent as text of a type the
// server infers from the column, so it is read as JSON in every pgx
// statement mode and driver; []byte would go as bytea (hex) where pgx does
// not describe the statement first (QueryExecModeExec, simple protocol),
// which jsonb refuses.
func Arg(h map[string][]string) (any, error) {
	b, err := Encode(h)
	if b == nil || err != nil {
		return nil, err
	}
	return string(b), nil
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it: control characters, quotes and backslashes, <, > and &, U+2028
// and U+2029, and invalid UTF-8 as U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += n
			continue
		}
		i += n
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
