package webhook

import (
	"fmt"
	"strings"

	"github.com/exactlyonce/dedupe"
)

// Tokens of HMACVerifier.SignedContent.
const (
	// SignedBody stands for the raw request body.
	SignedBody = "{body}"
	// SignedTimestamp stands for the value of HMACVerifier.TimestampHeader.
	SignedTimestamp = "{timestamp}"
	// SignedID stands for the value of HMACVerifier.IDHeader.
	SignedID = "{id}"
)

// partKind is what one part of a signed-content layout stands for.
type partKind int

const (
	partLiteral partKind = iota
	partBody
	partTimestamp
	partID
)

// part is one part of a signed-content layout.
type part struct {
	kind partKind
	lit  string // the text of a literal part
}

// layout is a parsed SignedContent: literals and tokens in order, {body}
// last, each {id} and {timestamp} followed by a literal separator.
type layout []part

// has reports whether the layout contains the token k.
func (l layout) has(k partKind) bool {
	for _, p := range l {
		if p.kind == k {
			return true
		}
	}
	return false
}

// separator returns the first byte of the literal that follows the token k;
// a value of k must not contain it. ok is false when k is absent.
func (l layout) separator(k partKind) (sep byte, ok bool) {
	for i, p := range l {
		if p.kind == k {
			return l[i+1].lit[0], true // parseLayout guarantees the literal
		}
	}
	return 0, false
}

// parts returns the byte strings the MAC covers, in order.
func (l layout) parts(id, ts string, body []byte) [][]byte {
	out := make([][]byte, len(l))
	for i, p := range l {
		switch p.kind {
		case partLiteral:
			out[i] = []byte(p.lit)
		case partID:
			out[i] = []byte(id)
		case partTimestamp:
			out[i] = []byte(ts)
		case partBody:
			out[i] = body
		}
	}
	return out
}

// parseLayout parses a SignedContent value. The rules make the signed bytes
// decode in one way only, so that no two deliveries (id, timestamp, body)
// sign the same bytes: {body} appears once, last; {id} and {timestamp} at
// most once each, each followed by a literal separator, whose first byte a
// value may not contain (a Unix timestamp is digits, so its separator must
// not start with one; an id is checked on every delivery). Braces are
// reserved for the tokens. It returns a *dedupe.ConfigError.
func parseLayout(s string) (layout, error) {
	bad := func(format string, args ...any) (layout, error) {
		return nil, &dedupe.ConfigError{Field: "SignedContent", Reason: fmt.Sprintf(format, args...)}
	}
	var l layout
	seen := map[partKind]bool{}
	for rest := s; rest != ""; {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			l = append(l, part{kind: partLiteral, lit: rest})
			break
		}
		if open > 0 {
			l = append(l, part{kind: partLiteral, lit: rest[:open]})
			rest = rest[open:]
		}
		end := strings.IndexByte(rest, '}')
		if rest[0] == '}' || end < 0 {
			return bad("unbalanced brace in %q; braces are reserved for %s, %s and %s", s, SignedBody, SignedTimestamp, SignedID)
		}
		var k partKind
		switch tok := rest[:end+1]; tok {
		case SignedBody:
			k = partBody
		case SignedTimestamp:
			k = partTimestamp
		case SignedID:
			k = partID
		default:
			return bad("unknown token %s; want %s, %s or %s", tok, SignedBody, SignedTimestamp, SignedID)
		}
		if seen[k] {
			return bad("%s appears twice", rest[:end+1])
		}
		seen[k] = true
		l = append(l, part{kind: k})
		rest = rest[end+1:]
	}
	if !seen[partBody] || l[len(l)-1].kind != partBody {
		return bad("must end with %s, so that the signature covers the body", SignedBody)
	}
	for i, p := range l {
		if p.kind != partID && p.kind != partTimestamp {
			continue
		}
		tok := SignedID
		if p.kind == partTimestamp {
			tok = SignedTimestamp
		}
		if l[i+1].kind != partLiteral {
			return bad("%s must be followed by a separator, e.g. %q, or the signed bytes are ambiguous", tok, tok+".")
		}
		if c := l[i+1].lit[0]; p.kind == partTimestamp && c >= '0' && c <= '9' {
			return bad("the separator after %s must not start with a digit", tok)
		}
	}
	return l, nil
}
