package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The reasons a field of a signed JSON body is refused (EventError.Reason).
const (
	reasonNotObject = "body is not a JSON object"
	reasonMissing   = "missing"
	reasonDuplicate = "the field appears more than once"
	reasonNotString = "not a string"
	reasonNotID     = "not a string or a number"
	reasonNotUTF8   = "not valid UTF-8 (invalid bytes or a lone surrogate escape)"
)

// fieldError is why a field could not be read from a JSON body: one of the
// reasons above.
type fieldError string

func (e fieldError) Error() string { return string(e) }

// errMissing is the fieldError of a field that is absent.
const errMissing = fieldError(reasonMissing)

// fieldRefusal is the *EventError of a field of provider's body that could
// not be read; a body that is not a JSON object is named as such.
func fieldRefusal(provider, field string, err error) *EventError {
	if fe, ok := err.(fieldError); ok && fe == reasonNotObject {
		return &EventError{Provider: provider, Field: "body", Reason: reasonNotObject}
	}
	return &EventError{Provider: provider, Field: field, Reason: err.Error()}
}

// jsonMember returns the raw value of the member named exactly name (no
// case folding, unlike encoding/json's decoding into a struct) of the JSON
// object obj. A name that appears twice is refused: readers disagree on
// which one counts (encoding/json takes the last, others the first), and a
// signed event has one id.
func jsonMember(obj []byte, name string) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fieldError(reasonNotObject)
	}
	var found json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fieldError(reasonNotObject)
		}
		key, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fieldError(reasonNotObject)
		}
		if key != name {
			continue
		}
		if found != nil {
			return nil, fieldError(reasonDuplicate)
		}
		found = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fieldError(reasonNotObject)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) { // nothing after it
		return nil, fieldError(reasonNotObject)
	}
	if found == nil {
		return nil, errMissing
	}
	return found, nil
}

// jsonPath returns the raw value at a dotted path of objects in body, e.g.
// "id" or "data.object.id", each name matched exactly (jsonMember).
func jsonPath(body []byte, path string) (json.RawMessage, error) {
	raw := json.RawMessage(body)
	for part := range strings.SplitSeq(path, ".") {
		v, err := jsonMember(raw, part)
		if err != nil {
			return nil, err
		}
		raw = v
	}
	return raw, nil
}

// jsonString decodes the JSON string raw strictly: the bytes the sender
// signed must map to one string only. encoding/json turns invalid UTF-8
// and lone surrogate escapes ("\udc00") into U+FFFD, so that two signed
// bodies with different bytes would decode to one id; they are refused.
func jsonString(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", fieldError(reasonNotString)
	}
	in := raw[1 : len(raw)-1]
	if !utf8.Valid(in) {
		return "", fieldError(reasonNotUTF8)
	}
	if bytes.IndexByte(in, '\\') < 0 {
		return string(in), nil // as it was signed; encoding/json validated the rest
	}
	var b strings.Builder
	for i := 0; i < len(in); {
		c := in[i]
		if c != '\\' {
			b.WriteByte(c)
			i++
			continue
		}
		if i+1 >= len(in) {
			return "", fieldError(reasonNotString)
		}
		switch e := in[i+1]; e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, ok := hex4(in[i+2:])
			if !ok {
				return "", fieldError(reasonNotString)
			}
			i += 6
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed by a low one is a
				// character.
				lo, ok := rune(0), false
				if len(in) >= i+6 && in[i] == '\\' && in[i+1] == 'u' {
					lo, ok = hex4(in[i+2:])
				}
				dec := utf16.DecodeRune(r, lo)
				if !ok || dec == utf8.RuneError {
					return "", fieldError(reasonNotUTF8)
				}
				r = dec
				i += 6
			}
			b.WriteRune(r)
			continue
		default:
			return "", fieldError(reasonNotString)
		}
		i += 2
	}
	return b.String(), nil
}

// hex4 reads four hex digits.
func hex4(p []byte) (rune, bool) {
	if len(p) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(p[:4]), 16, 16)
	return rune(n), err == nil
}

// jsonID returns the event id at path in body: a string, decoded strictly
// (jsonString), or a number, verbatim as it was signed.
func jsonID(body []byte, path string) (string, error) {
	raw, err := jsonPath(body, path)
	if err != nil {
		return "", err
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		return string(raw), nil
	}
	if len(raw) > 0 && raw[0] != '"' {
		return "", fieldError(reasonNotID)
	}
	return jsonString(raw)
}

// jsonOptionalString returns the string at path in body, "" when it is
// absent.
func jsonOptionalString(body []byte, path string) (string, error) {
	raw, err := jsonPath(body, path)
	if errors.Is(err, errMissing) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return "", nil
	}
	return jsonString(raw)
}
