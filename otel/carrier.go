package dedupeotel

import (
	"net/textproto"

	"github.com/exactlyonce/dedupe"
)

// carrier adapts dedupe.Headers to propagation.TextMapCarrier. Its Get also
// finds a key under its canonical MIME form, so an http.Header wrapped in
// dedupe.MapHeaders (whose keys net/http canonicalises: "Traceparent") gives
// up the "traceparent" the propagator asks for.
type carrier struct {
	h     dedupe.Headers
	canon map[string]string // the canonical forms of the propagator's fields
}

// Get returns the value of key, or of its canonical form.
func (c carrier) Get(key string) string {
	if v := c.h.Get(key); v != "" {
		return v
	}
	ck, ok := c.canon[key]
	if !ok {
		ck = textproto.CanonicalMIMEHeaderKey(key)
	}
	if ck != key {
		return c.h.Get(ck)
	}
	return ""
}

// canonical maps each of fields to its canonical MIME form.
func canonical(fields []string) map[string]string {
	m := make(map[string]string, len(fields))
	for _, f := range fields {
		m[f] = textproto.CanonicalMIMEHeaderKey(f)
	}
	return m
}

// Set sets key to value.
func (c carrier) Set(key, value string) { c.h.Set(key, value) }

// Keys lists the keys.
func (c carrier) Keys() []string { return c.h.Keys() }
